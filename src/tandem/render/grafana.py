"""``tandem render --target grafana``: Grafana provisioning and two dashboards for a deployment.

Files (``files``), laid out as Grafana's provisioning reads them:

- ``provisioning/datasources/tandem.yaml``: the Prometheus data source (uid ``tandem-prometheus``)
  at ``http://localhost:9090``, the Prometheus of ``tandem render --target prometheus``;
- ``provisioning/dashboards/tandem.yaml``: a file provider for ``dashboards/``;
- ``dashboards/tandem-overview.json``: the deployment as its clients see it, vLLM's own series
  by their names in the vLLM release the names were read from
  (``tandem.vllm_metrics.NAMES_OF_VLLM``): requests, tokens, latency percentiles, SLO
  attainment, errors, queue, KV cache, preemptions, prefix cache, speculative decoding;
- ``dashboards/tandem-cluster.json``: what vLLM cannot see of a multi-node group, tandem's own
  series (``tandem watch --serve-metrics``, names in ``tandem.wire``): the verdict, each rank,
  each node's memory, GPUs and RDMA ports, restarts;
- ``tandem-recording-rules.yml``: the top row's figures as recording rules over 1 min, with an
  idle guard (a ratio over no request is no sample, shown "No traffic", never 0);
- ``README.md``: how to load them.

Every panel is a ``Panel`` with its PromQL; the JSON is written from them. A panel marked
``optional_when`` shows data only where its feature is on (speculative decoding, prefix
caching, an NVIDIA GPU, an RDMA port); the expression says how to tell, so a test can hold every
other panel, and each optional one whose feature is on, to returning data. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from tandem import vllm_metrics as vm
from tandem import wire
from tandem.rankplan import RankPlan
from tandem.render import listing
from tandem.render.prometheus import FAILED, VLLM_JOB
from tandem.spec.deployment import Deployment

DATASOURCE_UID = "tandem-prometheus"
OVERVIEW_UID = "tandem-overview"
CLUSTER_UID = "tandem-cluster"
RULES_FILE = "tandem-recording-rules.yml"
D = 'deployment=~"$deployment"'
"""The label filter every query carries; Grafana fills ``$deployment`` from its variable."""
I = "$__rate_interval"  # noqa: E741 - Grafana's own spelling, kept short inside PromQL
UP = f'up{{job="{VLLM_JOB}",{D}}}'
"""1 for each leader whose ``/metrics`` answered the last scrape, 0 for each that did not."""


@dataclass(frozen=True)
class Panel:
    """One panel: its title, its queries (PromQL, legend) and how it shows them."""

    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    optional_when: str | None = None
    """PromQL that returns a series only where the panel's feature is on; None: never optional."""
    width: int = 8

    @property
    def height(self) -> int:
        """Grid rows: a stat is one figure, a graph needs room for its lines."""
        return 4 if self.kind == "stat" else 8


def _rate(metric: str, extra: str = "") -> str:
    return f"sum(rate({metric}{{{D}{extra}}}[{I}]))"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{{D}}}[{I}])))"


def _attainment(histogram: str, bound: str) -> str:
    """Share of observations at or under a bucket bound (an SLO must be a bucket boundary)."""
    return (
        f'sum(rate({histogram}_bucket{{{D},le="{bound}"}}[{I}])) / '
        f"(sum(rate({histogram}_count{{{D}}}[{I}])) > 0)"
    )


def _series(name: str) -> str:
    """A series of the chosen deployments."""
    return f"{name}{{{D}}}"


def _sum(name: str) -> str:
    """A series (a recording rule's too) summed over the chosen deployments."""
    return f"sum({_series(name)})"


def _p95_rule(histogram: str) -> str:
    """The recording rule of a latency histogram's p95, named after the histogram."""
    return f"deployment:{histogram.removeprefix('vllm:')}:p95_rate1m"


REQUESTS_RULE = "deployment:vllm_requests:rate1m"
OUTPUT_TOKENS_RULE = "deployment:vllm_output_tokens:rate1m"
INPUT_TOKENS_RULE = "deployment:vllm_input_tokens:rate1m"
ERROR_SHARE_RULE = "deployment:vllm_error_share:ratio_rate1m"
RECORDED = {
    REQUESTS_RULE: f"sum by (deployment) (rate({vm.REQUEST_SUCCESS}[1m]))",
    OUTPUT_TOKENS_RULE: f"sum by (deployment) (rate({vm.GENERATION_TOKENS}[1m]))",
    INPUT_TOKENS_RULE: f"sum by (deployment) (rate({vm.PROMPT_TOKENS}[1m]))",
    ERROR_SHARE_RULE: (
        f"sum by (deployment) (rate({vm.REQUEST_SUCCESS}{{{FAILED}}}[1m]))"
        f" / (sum by (deployment) (rate({vm.REQUEST_SUCCESS}[1m])) > 0)"
    ),
    **{
        _p95_rule(name): (
            f"histogram_quantile(0.95, sum by (deployment, le) (rate({name}_bucket[1m])))"
        )
        for name in (vm.TTFT_SECONDS, vm.ITL_SECONDS, vm.TPOT_SECONDS, vm.E2E_SECONDS)
    },
}
"""Recording rules: the top row's figures, one series per deployment. A ratio over nothing is
no sample (``> 0`` on its denominator), shown "No traffic"."""


def _p95_recorded(histogram: str) -> str:
    return _sum(_p95_rule(histogram))


def _stat(
    title: str, expr: str, legend: str, unit: str = "short", description: str = "", width: int = 4
) -> Panel:
    """A stat panel: one figure, of one query."""
    return Panel(title, ((expr, legend),), unit, "stat", description, width=width)


OVERVIEW: tuple[Panel, ...] = (
    _stat("Requests/s", _sum(REQUESTS_RULE), "req/s", "reqps"),
    _stat("Output tok/s", _sum(OUTPUT_TOKENS_RULE), "tok/s"),
    _stat("Input tok/s", _sum(INPUT_TOKENS_RULE), "tok/s"),
    _stat("TTFT p95", _p95_recorded(vm.TTFT_SECONDS), "TTFT p95", "s", width=3),
    _stat("ITL p95", _p95_recorded(vm.ITL_SECONDS), "ITL p95", "s", width=3),
    _stat("E2E p95", _p95_recorded(vm.E2E_SECONDS), "E2E p95", "s", width=3),
    _stat(
        "Errors",
        _sum(ERROR_SHARE_RULE),
        "error + abort",
        "percentunit",
        "Finished requests that ended in error or abort, over all finished.",
        width=3,
    ),
    _stat(
        "Leaders not answering",
        f"count({UP} == 0) or 0 * count({UP})",
        "down",
        description="A crashed or hung API server shows here while its vLLM series simply stop.",
    ),
    _stat("Running", _sum(vm.REQUESTS_RUNNING), "running"),
    _stat("Waiting", _sum(vm.REQUESTS_WAITING), "waiting"),
    _stat("KV cache used", f"max({_series(vm.KV_CACHE_USAGE)})", "fullest engine", "percentunit"),
    _stat("Preemptions/s", _rate(vm.PREEMPTIONS), "preemptions"),
    _stat(
        "TTFT SLO attainment (≤ 1 s)", _attainment(vm.TTFT_SECONDS, "1.0"), "≤ 1 s", "percentunit"
    ),
    _stat(
        "TPOT SLO attainment (≤ 100 ms)",
        _attainment(vm.TPOT_SECONDS, "0.1"),
        "≤ 100 ms",
        "percentunit",
    ),
    Panel(
        "Throughput",
        (
            (_rate(vm.REQUEST_SUCCESS), "requests/s"),
            (_rate(vm.GENERATION_TOKENS), "output tok/s"),
            (_rate(vm.PROMPT_TOKENS), "input tok/s"),
        ),
        width=12,
    ),
    Panel(
        "Latency p50 / p95 / p99",
        tuple(
            (_quantile(q, h), f"{label} p{int(q * 100)}")
            for h, label in (
                (vm.TTFT_SECONDS, "TTFT"),
                (vm.ITL_SECONDS, "ITL"),
                (vm.E2E_SECONDS, "E2E"),
            )
            for q in (0.5, 0.95, 0.99)
        ),
        "s",
        width=12,
    ),
    Panel(
        "Per-request TPOT and queue time p95",
        (
            (_quantile(0.95, vm.TPOT_SECONDS), "TPOT p95"),
            (_quantile(0.95, vm.QUEUE_SECONDS), "queue p95"),
        ),
        "s",
    ),
    Panel(
        "Mean phase of a request",
        tuple(
            (f"{_rate(h + '_sum')} / ({_rate(h + '_count')} > 0)", label)
            for h, label in (
                (vm.QUEUE_SECONDS, "queue"),
                (vm.PREFILL_SECONDS, "prefill"),
                (vm.DECODE_SECONDS, "decode"),
            )
        ),
        "s",
    ),
    Panel(
        "Finished by reason",
        (
            (
                f"sum by (finished_reason) (rate({_series(vm.REQUEST_SUCCESS)}[{I}]))",
                "{{finished_reason}}",
            ),
        ),
        "reqps",
    ),
    Panel(
        "Scheduler: running and waiting",
        (
            (_sum(vm.REQUESTS_RUNNING), "running"),
            (f"sum by (reason) ({_series(vm.REQUESTS_WAITING_BY_REASON)})", "waiting: {{reason}}"),
        ),
    ),
    Panel(
        "KV cache used, per engine",
        ((_series(vm.KV_CACHE_USAGE), "{{deployment}} engine {{engine}}"),),
        "percentunit",
    ),
    Panel(
        "Preemptions and refused requests",
        (
            (_rate(vm.PREEMPTIONS), "preempted/s"),
            (
                f"{_rate(vm.ADMISSION_REJECTIONS)} or 0 * {_sum(vm.REQUESTS_RUNNING)}",
                "refused by a queue limit/s",
            ),
        ),
        description="A refusal counter appears at the first refusal; 0 while the server answers.",
    ),
    Panel(
        "Prompt and output length p50",
        (
            (_quantile(0.5, vm.REQUEST_PROMPT_TOKENS), "prompt tokens"),
            (_quantile(0.5, vm.REQUEST_GENERATION_TOKENS), "output tokens"),
        ),
    ),
    Panel(
        "HTTP 5xx share",
        (
            (
                f"({_rate(vm.HTTP_REQUESTS, ',status=' + chr(34) + '5xx' + chr(34))}"
                f" or 0 * {_rate(vm.HTTP_REQUESTS)}) / ({_rate(vm.HTTP_REQUESTS)} > 0)",
                "5xx",
            ),
        ),
        "percentunit",
        description="The API server's answers with a 5xx status over all (its own counter).",
    ),
    Panel(
        "Prefix-cache hit rate",
        ((f"{_rate(vm.PREFIX_CACHE_HITS)} / ({_rate(vm.PREFIX_CACHE_QUERIES)} > 0)", "hits"),),
        "percentunit",
        "Prompt tokens found cached over those looked up; only while prefix caching is on.",
        optional_when=f'{vm.CACHE_CONFIG_INFO}{{{D},enable_prefix_caching="True"}}',
    ),
    Panel(
        "Speculative decoding: acceptance",
        (
            (f"{_rate(vm.SPEC_ACCEPTED)} / ({_rate(vm.SPEC_DRAFT_TOKENS)} > 0)", "acceptance rate"),
            (
                f"1 + {_rate(vm.SPEC_ACCEPTED)} / ({_rate(vm.SPEC_DRAFTS)} > 0)",
                "mean acceptance length",
            ),
        ),
        description="Only on a server that drafts. Acceptance depends on the content: measure "
        "it on the traffic you serve.",
        optional_when=_series(vm.SPEC_DRAFTS),
    ),
)

_NVIDIA = _series(wire.TANDEM_GPU_THROTTLED)
"""Exported for every GPU ``nvidia-smi`` reads: the GPU panels' feature."""

CLUSTER: tuple[Panel, ...] = (
    _stat(
        "Verdict",
        f"max by (verdict) ({_series(wire.TANDEM_VERDICT)}) == 1",
        "{{verdict}}",
        description="tandem's health model: healthy, starting, degraded, stalled or down.",
        width=6,
    ),
    Panel(
        "Ranks up",
        ((_sum(wire.TANDEM_RANK_UP), "up"), (f"count({_series(wire.TANDEM_RANK_UP)})", "of")),
        kind="stat",
        width=6,
    ),
    _stat("Group restarts", _sum(wire.TANDEM_RESTARTS + wire.TOTAL), "restarts", width=6),
    _stat(
        "Watcher's last sample",
        f"time() - max({_series(wire.TANDEM_SAMPLE_TIMESTAMP)})",
        "age",
        "s",
        "Seconds since `tandem watch --serve-metrics` last sampled; the rank and node panels "
        "are as old as this.",
        width=6,
    ),
    Panel(
        "Rank up", ((_series(wire.TANDEM_RANK_UP), "rank {{rank}} {{role}} on {{node}}"),), width=12
    ),
    Panel("Rank processes", ((_series(wire.TANDEM_RANK_PROCESSES), "rank {{rank}}"),), width=12),
    Panel("Rank resident memory", ((_series(wire.TANDEM_RANK_RSS), "rank {{rank}}"),), "bytes"),
    Panel(
        "Rank CPU",
        ((f"rate({_series(wire.TANDEM_RANK_CPU + wire.TOTAL)}[{I}])", "rank {{rank}}"),),
        "percentunit",
        "CPU seconds per second of each rank's processes.",
    ),
    Panel(
        "Node memory available",
        (
            (
                f"{_series(wire.TANDEM_NODE_MEMORY_AVAILABLE)}"
                f" / {_series(wire.TANDEM_NODE_MEMORY_TOTAL)}",
                "{{node}}",
            ),
        ),
        "percentunit",
        "MemAvailable over MemTotal (/proc/meminfo): on unified-memory nodes (DGX Spark) the "
        "GPU's memory too.",
    ),
    Panel(
        "OOM kills (1 h)",
        ((f"increase({_series(wire.TANDEM_NODE_OOM_KILLS + wire.TOTAL)}[1h])", "{{node}}"),),
        width=12,
    ),
    Panel("Leader /metrics up", ((UP, "{{deployment}} {{node}}"),), width=12),
    *(
        Panel(title, ((_series(name), "{{node}} GPU {{gpu}}"),), unit, optional_when=_NVIDIA)
        for title, name, unit in (
            ("GPU power", wire.TANDEM_GPU_POWER, "watt"),
            ("GPU temperature", wire.TANDEM_GPU_TEMPERATURE, "celsius"),
        )
    ),
    Panel(
        "GPU SM clock and throttling",
        (
            (_series(wire.TANDEM_GPU_SM_CLOCK), "{{node}} GPU {{gpu}} clock"),
            (_series(wire.TANDEM_GPU_THROTTLED), "{{node}} GPU {{gpu}} throttled"),
        ),
        "hertz",
        optional_when=_NVIDIA,
    ),
    Panel(
        "RDMA traffic",
        (
            (
                f"rate({_series(wire.TANDEM_RDMA_TRANSMIT + wire.TOTAL)}[{I}])",
                "{{node}} {{device}} tx",
            ),
            (
                f"rate({_series(wire.TANDEM_RDMA_RECEIVE + wire.TOTAL)}[{I}])",
                "{{node}} {{device}} rx",
            ),
        ),
        "Bps",
        "The fabric between the nodes (the tensor-parallel all-reduces).",
        optional_when=_series(wire.TANDEM_RDMA_TRANSMIT + wire.TOTAL),
        width=16,
    ),
)

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
"""Every query's data source: the dashboard's ``datasource`` variable."""
_NO_TRAFFIC = [
    {"type": "special", "options": {"match": "null+nan", "result": {"text": "No traffic"}}}
]


def _panel_json(panel: Panel, number: int, x: int, y: int) -> dict:
    stat = panel.kind == "stat"
    description = panel.description + (
        " Optional: empty where the feature is off." if panel.optional_when else ""
    )
    return {
        "id": number,
        "type": panel.kind,
        "title": panel.title,
        "description": description.strip(),
        "datasource": _DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "mappings": _NO_TRAFFIC if stat else []},
            "overrides": [],
        },
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "none"}
        if stat
        else {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": _DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
            }
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def _layout(panels: tuple[Panel, ...]) -> list[dict]:
    """Left to right, rows of 24 columns."""
    placed, x, y, row_height = [], 0, 0, 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        placed.append(_panel_json(panel, number, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return placed


def _variables() -> dict:
    return {
        "list": [
            {
                "name": "datasource",
                "type": "datasource",
                "query": "prometheus",
                "current": {"text": DATASOURCE_UID, "value": DATASOURCE_UID},
            },
            {
                "name": "deployment",
                "type": "query",
                "datasource": _DATASOURCE,
                "query": {"query": "label_values(up, deployment)", "refId": "deployments"},
                "definition": "label_values(up, deployment)",
                "refresh": 2,
                "includeAll": True,
                "multi": True,
                "allValue": ".+",
            },
        ]
    }


def dashboard(uid: str, title: str, description: str, panels: tuple[Panel, ...], link: str) -> dict:
    """One dashboard's JSON model (Grafana >= 10.4's schema)."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["tandem", "vllm"],
        "schemaVersion": 39,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": _variables(),
        "links": [
            {
                "type": "dashboards",
                "tags": ["tandem"],
                "title": link,
                "asDropdown": False,
                "keepTime": True,
                "includeVars": True,
            }
        ],
        "panels": _layout(panels),
    }


def dashboards(plan: RankPlan, deployment: Deployment) -> dict[str, dict]:
    """File name -> dashboard JSON: the overview and the cluster dashboards."""
    pinned = deployment.recipe.engine.vllm_version or "unpinned"
    return {
        "tandem-overview.json": dashboard(
            OVERVIEW_UID,
            "tandem / Overview",
            f"vLLM's series by their names in vLLM {vm.NAMES_OF_VLLM} (the recipe pins "
            f"{pinned}); rendered for {plan.deployment}.",
            OVERVIEW,
            "tandem / Cluster",
        ),
        "tandem-cluster.json": dashboard(
            CLUSTER_UID,
            "tandem / Cluster",
            "tandem's own series (`tandem watch --serve-metrics`): the verdict, ranks, nodes, "
            "GPUs, fabric and restarts that vLLM cannot see of a multi-node group.",
            CLUSTER,
            "tandem / Overview",
        ),
    }


def recording_rules(plan: RankPlan) -> dict:
    return {
        "groups": [
            {
                "name": f"tandem-recording-{plan.deployment}",
                "rules": [{"record": name, "expr": expr} for name, expr in RECORDED.items()],
            }
        ]
    }


def _datasource() -> dict:
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "tandem Prometheus",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": "http://localhost:9090",
                "isDefault": True,
                "jsonData": {"timeInterval": "5s"},
            }
        ],
    }


def _provider() -> dict:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "tandem",
                "folder": "tandem",
                "type": "file",
                "allowUiUpdates": True,
                "options": {"path": "/var/lib/grafana/dashboards/tandem"},
            }
        ],
    }


def readme(plan: RankPlan, deployment: Deployment) -> str:
    pinned = deployment.recipe.engine.vllm_version
    warning = (
        f"\n**The recipe pins vLLM {pinned}; these names were read from {vm.NAMES_OF_VLLM}.** "
        "A panel whose metric was renamed shows no data: check with the query browser.\n"
        if pinned and pinned != vm.NAMES_OF_VLLM
        else ""
    )
    return f"""# Grafana for `{plan.deployment}`

Generated by `tandem render {deployment.recipe.name} --target grafana --out DIR`.
{warning}
Two dashboards over the Prometheus of `tandem render {deployment.recipe.name} --target
prometheus` (it scrapes the leader's vLLM `/metrics` as job `vllm` and `tandem watch
--serve-metrics` as job `tandem-watch`, each labelled `deployment`):

- `dashboards/tandem-overview.json`, *tandem / Overview*: vLLM's series by their vLLM
  {vm.NAMES_OF_VLLM} names: requests, tokens, TTFT / ITL / TPOT / E2E percentiles, SLO
  attainment, errors, queue, KV cache, preemptions, prefix cache, speculative decoding.
- `dashboards/tandem-cluster.json`, *tandem / Cluster*: tandem's verdict, each rank, each
  node's memory, GPUs and RDMA ports, restarts.

Panels marked optional stay empty where their feature is off (speculative decoding, prefix
caching, an NVIDIA GPU, an RDMA port); every other panel returns data under load.

1. Prometheus: add `{RULES_FILE}` to `rule_files:` of `prometheus.yml` beside
   `tandem-rules.yml` (the top row's stat panels read its series), then
   `promtool check rules {RULES_FILE}` and restart Prometheus.
2. Grafana >= 10.4, provisioned from files: mount `provisioning/` at
   `/etc/grafana/provisioning` and `dashboards/` at `/var/lib/grafana/dashboards/tandem`,
   e.g. `docker run -p 3000:3000 --network host -v $PWD/provisioning:/etc/grafana/provisioning
   -v $PWD/dashboards:/var/lib/grafana/dashboards/tandem grafana/grafana`. The data source
   points at `http://localhost:9090`; change its `url` in
   `provisioning/datasources/tandem.yaml` if Prometheus runs elsewhere.
3. Or by hand: *Dashboards → New → Import*, upload each JSON file, pick the Prometheus data
   source.
"""


def files(plan: RankPlan, deployment: Deployment) -> dict[str, str]:
    """File name (with its folder) -> text."""
    dump = lambda data: yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)  # noqa: E731
    written = {
        "provisioning/datasources/tandem.yaml": dump(_datasource()),
        "provisioning/dashboards/tandem.yaml": dump(_provider()),
        RULES_FILE: dump(recording_rules(plan)),
        "README.md": readme(plan, deployment),
    }
    for name, board in dashboards(plan, deployment).items():
        written[f"dashboards/{name}"] = json.dumps(board, indent=2, ensure_ascii=False) + "\n"
    return written


def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
    """Every file: a listing (``yaml``) or a JSON object of file -> text (``json``)."""
    return listing(files(plan, deployment), fmt)
