"""``tandem render --target prometheus``: a scrape config and alert rules for one deployment.

Three files (``files``), or one listing of them (``render``):

- ``prometheus.yml``: scrapes the leader's vLLM ``/metrics`` (job ``vllm``, labelled with the
  deployment) and ``tandem watch --serve-metrics`` (job ``tandem-watch``): headless workers
  export nothing, so each rank's liveness, every node's memory and GPUs come from the watcher.
  The scrape interval is the recipe's ``watch.interval_s``: each vLLM scrape stalls its API
  server ~35 ms, so seconds, not sub-seconds. node_exporter/DCGM jobs are shown commented out;
  on DGX Spark DCGM's memory fields are unavailable by design, which is why tandem reads
  ``/proc/meminfo``.
- ``tandem-rules.yml``: alerts for a rank down, the leader down, the watcher silent, a stall
  (requests running, no token for 2 min), the KV cache full, preemptions, GPU temperature
  (``watch.max_temperature_c``) and throttling, host memory low, and OOM kills.
- ``README.md``: how to run it, and where vLLM's own Grafana dashboards fit.

Pure: the text is a function of the rank plan and the recipe.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import yaml

from tandem import vllm_metrics as vm
from tandem import wire
from tandem.rankplan import RankPlan, placed_groups, plan_ranks
from tandem.render import listing
from tandem.spec.deployment import Deployment

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "tandem-rules.yml"
README_FILE = "README.md"
RANK_DOWN_FOR = "15s"
"""A rank of a vLLM group never comes back by itself, so a short ``for`` only skips a scrape
that raced the process start."""
VLLM_JOB = "vllm"
"""The scrape job of the leaders' ``/metrics``; its ``up`` series tells a leader that is gone."""
FAILED = f'finished_reason=~"{"|".join(vm.ERROR_REASONS)}"'
"""The label matcher of the requests that ended in error or abort."""


def _leader_target(plan: RankPlan) -> str:
    parts = urlsplit(plan.endpoint)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def group_plans(plan: RankPlan, deployment: Deployment) -> list[RankPlan]:
    """Every group's plan: ``plan`` alone for one group, each replica's own (its leader on its
    own nodes) for a deployment with replicas."""
    if deployment.recipe.replicas == 1:
        return [plan]
    return [plan_ranks(group) for group in placed_groups(deployment)]


def _leader_config(name: str, plan: RankPlan, group: int | None) -> dict:
    leader = plan.leader
    labels = {"deployment": name, "node": leader.node, "rank": str(leader.rank)}
    return {
        "targets": [_leader_target(plan)],
        "labels": labels | ({"group": str(group)} if group is not None else {}),
    }


def scrape_config(plan: RankPlan, deployment: Deployment) -> dict:
    """Each group's leader (job ``vllm``, labelled with its group when there are replicas) and
    ``tandem watch``'s exporter; the router is left out: its ``/metrics`` counts routing, not
    serving, and every request it sends is counted by the leader that served it."""
    watch = deployment.recipe.watch
    interval = f"{watch.interval_s:g}s"
    plans = group_plans(plan, deployment)
    several = len(plans) > 1
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [RULES_FILE],
        "scrape_configs": [
            {
                "job_name": VLLM_JOB,
                "metrics_path": wire.METRICS_PATH,
                "static_configs": [
                    _leader_config(deployment.name, p, i if several else None)
                    for i, p in enumerate(plans)
                ],
            },
            {
                "job_name": "tandem-watch",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [f"localhost:{watch.metrics_port}"],
                        "labels": {"deployment": plan.deployment},
                    }
                ],
            },
        ],
    }


def _rule(
    alert: str, expr: str, for_: str, summary: str, description: str, severity: str = "warning"
) -> dict:
    return {
        "alert": alert,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def alert_rules(plan: RankPlan, deployment: Deployment) -> dict:
    watch = deployment.recipe.watch
    d = f'deployment="{plan.deployment}"'
    silent_s = round(4 * watch.interval_s)
    rules = [
        _rule(
            "TandemRankDown",
            f"{wire.TANDEM_RANK_UP}{{{d}}} == 0",
            RANK_DOWN_FOR,
            "rank {{ $labels.rank }} ({{ $labels.role }} on {{ $labels.node }}) of "
            "{{ $labels.deployment }} is down",
            "vLLM cannot heal a group: the leader may still answer /health, but the next "
            "request fails. Restart the whole group (`tandem supervise` does it).",
            severity="critical",
        ),
        _rule(
            "VllmLeaderDown",
            f'up{{job="{VLLM_JOB}",{d}}} == 0',
            "30s",
            "the leader of {{ $labels.deployment }} does not answer /metrics",
            "The API server is gone or hung; `tandem status` and `tandem logs --rank 0`.",
            severity="critical",
        ),
        _rule(
            "TandemWatchSilent",
            f"time() - {wire.TANDEM_SAMPLE_TIMESTAMP}{{{d}}} > {silent_s} "
            f"or absent({wire.TANDEM_SAMPLE_TIMESTAMP}{{{d}}})",
            "1m",
            f"no tandem watch sample of {plan.deployment} for {silent_s} s",
            "Rank liveness, memory and GPU alerts need `tandem watch --serve-metrics "
            f"{watch.metrics_port}` running.",
        ),
        _rule(
            "TandemDeploymentStalled",
            f'{wire.TANDEM_VERDICT}{{{d},verdict="stalled"}} == 1 or '
            f"(sum({vm.REQUESTS_RUNNING}{{{d}}}) > 0 and "
            f"sum(rate({vm.GENERATION_TOKENS}{{{d}}}[2m])) == 0)",
            "2m",
            f"{plan.deployment} has requests running but produces no token",
            "A collective hangs (a dead peer, NCCL) or the engine is stuck; see the ranks' "
            "logs for NCCL watchdog or EngineDeadError.",
            severity="critical",
        ),
        _rule(
            "VllmKvCacheFull",
            f"max({vm.KV_CACHE_USAGE}{{{d}}}) > 0.95",
            "5m",
            f"the KV cache of {plan.deployment} is over 95 % full",
            "Requests queue and get preempted; lower concurrency or max_model_len, or add "
            "KV memory.",
        ),
        _rule(
            "VllmPreempting",
            f"sum(rate({vm.PREEMPTIONS}{{{d}}}[5m])) > 0",
            "5m",
            f"{plan.deployment} preempts requests",
            "The KV cache is too small for the load: preempted requests are recomputed.",
        ),
        _rule(
            "TandemRequestErrors",
            f"sum(rate({vm.REQUEST_SUCCESS}{{{d},{FAILED}}}[5m]))"
            f" / sum(rate({vm.REQUEST_SUCCESS}{{{d}}}[5m])) > "
            f"{watch.max_error_rate if watch.max_error_rate is not None else 0.01:g}",
            "5m",
            f"requests of {plan.deployment} end in error or abort",
            "Share of finished requests with finished_reason error or abort (length and stop "
            "count as finished).",
        ),
    ]
    if watch.max_temperature_c is not None:
        rules.append(
            _rule(
                "TandemGpuHot",
                f"{wire.TANDEM_GPU_TEMPERATURE}{{{d}}} > {watch.max_temperature_c:g}",
                "2m",
                "GPU {{ $labels.gpu }} on {{ $labels.node }} is at {{ $value }} °C",
                f"Above the recipe's watch.max_temperature_c ({watch.max_temperature_c:g} °C).",
            )
        )
    rules += [
        _rule(
            "TandemGpuThrottled",
            f"{wire.TANDEM_GPU_THROTTLED}{{{d}}} == 1",
            "1m",
            "GPU {{ $labels.gpu }} on {{ $labels.node }} is throttled",
            "A thermal or hardware slowdown holds its clocks down (nvidia-smi "
            "clocks_event_reasons).",
        ),
        _rule(
            "TandemHostMemoryLow",
            f"{wire.TANDEM_NODE_MEMORY_AVAILABLE}{{{d}}} / "
            f"{wire.TANDEM_NODE_MEMORY_TOTAL}{{{d}}} < 0.05",
            "5m",
            "{{ $labels.node }} has under 5 % of its memory available",
            "On unified-memory nodes (DGX Spark) this is the GPU's memory too.",
        ),
        _rule(
            "TandemOomKill",
            f"increase({wire.TANDEM_NODE_OOM_KILLS}{wire.TOTAL}{{{d}}}[10m]) > 0",
            "0s",
            "the OOM killer killed a process on {{ $labels.node }}",
            "/proc/vmstat oom_kill went up; check the ranks with `tandem status`.",
            severity="critical",
        ),
    ]
    return {"groups": [{"name": f"tandem-{plan.deployment}", "rules": rules}]}


def readme(plan: RankPlan, deployment: Deployment) -> str:
    port = deployment.recipe.watch.metrics_port
    return f"""# Prometheus for `{plan.deployment}`

Generated by `tandem render {deployment.recipe.name} --target prometheus --out DIR`.

1. On the machine that runs tandem: `tandem watch {plan.deployment} --serve-metrics {port}`
   (headless vLLM workers export no /metrics; the watcher reports each rank's liveness, every
   node's memory and GPUs). Change `localhost:{port}` in `{CONFIG_FILE}` if Prometheus runs
   elsewhere.
2. `promtool check config {CONFIG_FILE}`, then `prometheus --config.file={CONFIG_FILE}`.

Grafana: vLLM's own dashboards (`examples/observability/dashboards/grafana/` in the vLLM
repository, Grafana >= 10.4: Overview, Instances, KV Cache, Speculative Decoding, Service
status) read the `vllm:*` series of the `vllm` job as scraped here; take them from the vLLM
version you run, since they follow its metric names. The `tandem_*` series add what those
dashboards cannot show for a multi-node group: per-rank liveness and host memory per node.
"""


def files(plan: RankPlan, deployment: Deployment) -> dict[str, str]:
    """File name -> text, to write into one folder."""
    header = (
        f"# Prometheus config for tandem deployment '{plan.deployment}' "
        "(tandem render --target prometheus)\n"
    )
    hosts = [r.address for p in group_plans(plan, deployment) for r in p.ranks]
    commented = (
        "# Host exporters, where installed (tandem watch already reads /proc/meminfo):\n"
        "#  - job_name: node\n"
        "#    static_configs:\n"
        f"#      - targets: [{', '.join(f'{a}:9100' for a in hosts)}]\n"
        "#  - job_name: dcgm   # GPU counters; on DGX Spark the FB_* memory fields are dead\n"
        "#    static_configs:\n"
        f"#      - targets: [{', '.join(f'{a}:9400' for a in hosts)}]\n"
    )
    return {
        CONFIG_FILE: header
        + yaml.safe_dump(scrape_config(plan, deployment), sort_keys=False)
        + commented,
        RULES_FILE: yaml.safe_dump(
            alert_rules(plan, deployment), sort_keys=False, allow_unicode=True, width=1000
        ),
        README_FILE: readme(plan, deployment),
    }


def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
    """All three files: a listing (``yaml``) or a JSON object (``json``); ``check_format``
    refused any other format before."""
    return listing(files(plan, deployment), fmt)
