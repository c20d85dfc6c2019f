"""The OpenSSH transport's error mapping and the runtimes' shell scripts (no hosts needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from factories import make_deployment, make_recipe

from tandem import agent
from tandem.backends.openssh import OpenSSH, SSHTarget, classify
from tandem.backends.runtimes import (
    DockerRuntime,
    VenvRuntime,
    poll_script,
    rank_dir,
    resolve_runtime,
    tail_script,
)
from tandem.errors import SSHError
from tandem.rankplan import plan_ranks
from tandem.spec.cluster import Runtime, SSHOptions

TARGET = SSHTarget(node="spark-b", host="169.254.134.1", user="root")


@pytest.mark.parametrize(
    "code, stderr, reason",
    [
        (255, "ssh: connect to host 169.254.134.1 port 22: Connection refused", "unreachable"),
        (255, "ssh: connect to host 169.254.134.1 port 22: No route to host", "unreachable"),
        (255, "ssh: Could not resolve hostname spark-b: Name or service not known", "unreachable"),
        (255, "root@169.254.134.1: Permission denied (publickey).", "key-refused"),
        (127, "sh: 1: /opt/vllm/bin/vllm: not found", "command-missing"),
        (0, "", None),
        (1, "some failure of the command itself", None),
    ],
    ids=["refused", "no route", "dns", "key refused", "command missing", "ok", "command failed"],
)
def test_ssh_exits_map_to_one_reason(code, stderr, reason):
    error = classify(TARGET, code, stderr)
    assert (error.reason if error else None) == reason
    if error:
        assert error.node == "spark-b" and error.hint


def test_command_line_reuses_one_connection_and_honours_the_config(tmp_path):
    ssh = OpenSSH(config_file="/etc/tandem/ssh_config", control_dir=tmp_path)
    argv = ssh.argv(SSHTarget(node="n", host="h", user="u", port=2222), ["uname", "-r"])
    assert argv[:3] == ["ssh", "-F", "/etc/tandem/ssh_config"]
    assert "ControlMaster=auto" in argv
    control = next(a for a in argv if a.startswith("ControlPath="))
    assert control.startswith(f"ControlPath={tmp_path}/") and control.endswith("-%C")
    other = OpenSSH(config_file="/other", control_dir=tmp_path).argv(SSHTarget("n", "h"), ["x"])
    assert control not in other  # a connection made with other keys is never reused
    assert "BatchMode=yes" in argv
    assert argv[-5:] == ["-l", "u", "h", "--", "uname -r"]
    assert argv[argv.index("-p") + 1] == "2222"


def test_auto_runtime_follows_the_image():
    assert resolve_runtime(SSHOptions(), "repo/vllm@sha256:" + "0" * 64) is Runtime.DOCKER
    assert resolve_runtime(SSHOptions(), None) is Runtime.VENV
    assert resolve_runtime(SSHOptions(runtime="venv"), "repo/vllm:1") is Runtime.VENV


def test_rank_folders_are_short_enough_for_vllm_sockets():
    assert len(str(rank_dir(SSHOptions(), "a" * 40, 7) / "tmp")) + 40 < 107


@pytest.mark.parametrize(
    "runtime",
    [VenvRuntime(SSHOptions()), DockerRuntime(SSHOptions(), "repo/vllm:1")],
    ids=["venv", "docker"],
)
def test_every_script_is_valid_sh(runtime):
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"))
    rank = plan_ranks(deployment).ranks[1]
    # A secret reaches a rank only at launch, from the caller's environment (never the recipe).
    rank = rank.model_copy(update={"env": {**rank.env, "HF_TOKEN": "x y'z"}})
    scripts = [
        runtime.start_script(rank, deployment),
        runtime.status_script("test", 1),
        runtime.stop_script("test", 1),
        poll_script(runtime.status_script("test", 1), rank_dir(SSHOptions(), "t", 1) / "l", 5),
        tail_script(rank_dir(SSHOptions(), "t", 1) / "l", 10),
    ]
    for script in scripts:
        check = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
        assert check.returncode == 0, (check.stderr, script)


def test_venv_start_marks_the_process_and_records_its_pid():
    deployment = make_deployment()
    rank = plan_ranks(deployment).ranks[1]
    script = VenvRuntime(SSHOptions(vllm_command="/opt/v/bin/vllm")).start_script(rank, deployment)
    assert "export TANDEM_DEPLOYMENT=test" in script and "export TANDEM_RANK=1" in script
    assert "export TMPDIR=/tmp/tandem/test/rank1/tmp" in script
    assert "setsid sh -c" in script and "/opt/v/bin/vllm serve org/model" in script
    assert "--headless" in script


def test_unknown_failures_keep_the_ssh_message():
    error = classify(TARGET, 255, "kex_exchange_identification: read: Connection reset by peer")
    assert isinstance(error, SSHError) and error.reason == SSHError.UNREACHABLE


def _agent(request: dict) -> dict:
    """The node agent as the ssh backend runs it: its source on a Python's stdin."""
    done = subprocess.run(
        [sys.executable, "-", json.dumps(request)],
        input=agent.source(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_node_agent_finds_only_this_launchs_processes():
    """Two processes marked with the same deployment and rank, of two launches: the node agent
    the ssh backend runs on a node to observe a rank lists only its own launch's one."""
    marks = {"TANDEM_DEPLOYMENT": "dup", "TANDEM_RANK": "0"}
    ours, theirs = (
        subprocess.Popen(["sleep", "30"], env={**marks, "TANDEM_LAUNCH": launch})
        for launch in ("ours", "theirs")
    )
    try:
        request = {"deployment": "dup", "launch": "ours", "logs": {"0": ["/nonexistent", 0]}}
        answer = _agent(request)
        assert {p["pid"] for p in answer["ranks"]["0"]} == {ours.pid}
        assert answer["logs"] == {"0": []} and answer["node"] is None
        legacy = _agent({"deployment": "dup", "launch": None})  # a state without a launch id
        assert {p["pid"] for p in legacy["ranks"]["0"]} == {ours.pid, theirs.pid}
    finally:
        ours.kill()
        theirs.kill()
