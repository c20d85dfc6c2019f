"""What the k8s backend reads from a pod and its events (pure), in the shapes real kubelets
wrote them on the test bed (tests/k8s/test_kubelet_engine.py)."""

from __future__ import annotations

import pytest

from tandem.backends import k8s as backend

# FailedCreatePodSandBox as kubelet 1.20 reported it on the test bed, before containerd's
# restrict_oom_score_adj (runc could not lower the sandbox's OOM score).
SANDBOX = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to create "
    "containerd task: failed to create shim task: OCI runtime create failed: runc create "
    "failed: unable to start container process: can't get final child's PID from pipe: EOF"
)


def event(reason: str, count: int, kind: str = "Warning", message: str = SANDBOX) -> dict:
    return {"type": kind, "reason": reason, "count": count, "message": message}


@pytest.mark.parametrize(
    ("events", "fails"),
    [
        ([event("Scheduled", 1, "Normal", "assigned")], False),
        ([event("FailedCreatePodSandBox", 2)], False),
        ([event("FailedCreatePodSandBox", 3)], True),
        ([event("FailedMount", 5, message="hostPath type check failed: /dev/infiniband")], True),
        ([event("Unhealthy", 9, message="Startup probe failed")], False),
        ([event("FailedCreatePodSandBox", 3, kind="Normal")], False),
    ],
    ids=[
        "a normal event",
        "a sandbox failure the kubelet has tried twice",
        "a sandbox failure tried three times",
        "a volume that never mounts",
        "a failing startup probe is the probe's business",
        "only warnings count",
    ],
)
def test_events_that_do_not_heal(events: list[dict], fails: bool):
    failure = backend.event_failure(events)
    assert (failure is not None) == fails
    if failure:
        assert failure[0] == 1 and events[0]["reason"] in failure[1]


def pod(restarts: int = 0, state: str = "running", phase: str = "Running") -> dict:
    status = {
        "name": "vllm",
        "restartCount": restarts,
        "state": {state: {}},
    }
    if restarts:
        status["lastState"] = {
            "terminated": {"exitCode": 137, "reason": "Error", "finishedAt": "2026-12-05T11:30:02Z"}
        }
    return {"status": {"phase": phase, "containerStatuses": [status]}}


def test_a_restarted_container_is_a_problem_with_its_time_and_exit():
    assert backend.restart_problem(pod()) is None
    assert backend.restart_problem(None) is None
    problem = backend.restart_problem(pod(restarts=1))
    assert "restarted its container (1 time(s)" in problem
    assert "2026-12-05T11:30:02Z" in problem and "exit 137 Error" in problem


@pytest.mark.parametrize(
    ("shape", "running"),
    [
        (pod(), True),
        (pod(state="waiting"), False),
        (pod(phase="Pending", state="waiting"), False),
        (None, False),
    ],
    ids=["running", "container waiting", "pending", "no pod"],
)
def test_pod_running(shape: dict | None, running: bool):
    assert backend.pod_running(shape) is running
