"""Reading a pod's log incrementally (``kubectl logs --timestamps``) into the shared start-up
phases. No kubelet runs here, so `kubectl logs` output is replayed from a recorded vLLM start."""

from __future__ import annotations

from tandem.backends import k8s as backend
from tandem.vllm_log import BootLog, Phase

# vLLM's own lines, as `kubectl logs --timestamps` prefixes them (RFC 3339, nanoseconds).
RECORDED = [
    "2026-11-30T05:00:01.000000001Z INFO [parallel_state.py] world_size=2 rank=0 local_rank=0",
    "2026-11-30T05:00:09.500000000Z INFO [gpu_model_runner.py] Model loading took 83.5 GiB",
    "2026-11-30T05:00:20.250000000Z INFO [kv_cache_utils.py] GPU KV cache size: 1,790,000 tokens",
    "2026-11-30T05:00:31.000000000Z INFO [api_server.py] Starting vLLM API server 0 on http://0.0.0.0:8888",
]


class ReplayKubectl(backend.Kubectl):
    """`kubectl logs` answering from a growing recording, honouring --since-time as kubectl
    does (lines at or after the given time)."""

    def __init__(self) -> None:
        super().__init__("kubectl", "default")
        self.available = 0
        self.calls: list[tuple[str, ...]] = []

    def logs(self, pod: str, *extra: str) -> str | None:
        self.calls.append(extra)
        since = next((e.split("=", 1)[1] for e in extra if e.startswith("--since-time=")), "")
        lines = [ln for ln in RECORDED[: self.available] if ln.split(" ", 1)[0] >= since]
        return "\n".join(lines) + ("\n" if lines else "")


def test_pod_log_yields_each_line_once_and_feeds_the_phases():
    kubectl = ReplayKubectl()
    log = backend.PodLog(kubectl, "dsv4-flash-tp2-0")
    assert log.new_lines() == []
    kubectl.available = 2
    first = log.new_lines()
    kubectl.available = 4
    second = log.new_lines()
    assert log.new_lines() == []
    assert first + second == [line.split(" ", 1)[1] for line in RECORDED]
    assert kubectl.calls[-1] == ("--timestamps", "--since-time=2026-11-30T05:00:31.000000000Z")
    boot = BootLog(0)
    phases = [phase for line in first + second for phase, _ in boot.feed(line)]
    assert phases[:2] == [Phase.RENDEZVOUS, Phase.WEIGHTS_LOADED]
    assert Phase.API_SERVER in phases
    assert boot.figures.kv_cache_tokens == 1_790_000


def test_pod_summary_and_failure_of_a_missing_pod():
    assert backend.pod_summary(None) == "not created"
    assert backend.pod_failure(None, now=None) is None
