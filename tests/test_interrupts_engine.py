"""An interrupted ``up`` or ``check --fabric`` leaves nothing that blocks the next ``up``.

Real commands, real signals, the real engine: ``tandem up`` is interrupted with SIGINT, SIGTERM
and SIGKILL in its preflight (throw-away namespaces) and while its ranks boot; ``tandem check
--fabric`` while its namespaces exist. SIGINT and SIGTERM must clean up before the command
exits; what a SIGKILL leaves, the next ``up`` removes (saying so) and then comes up for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.backends.processes import marked_processes

pytestmark = [
    pytest.mark.engine,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

NAME = "interrupted"
CLUSTER = """\
name: interrupts
transport: local
local: {isolation: netns, subnet: 10.82.0.0/24}
nodes:
  - {name: node0, address: 10.82.0.1, control_plane_interface: tdm0,
     env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
  - {name: node1, address: 10.82.0.2, control_plane_interface: tdm1,
     env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_hf_home):
    folder = tmp_path_factory.mktemp("interrupts")
    recipe = Path(__file__).parents[1] / "src/tandem/recipes/tiny-local.yaml"
    (folder / "recipe.yaml").write_text(
        recipe.read_text().replace("name: tiny-local", f"name: {NAME}", 1)
    )
    (folder / "cluster.yaml").write_text(CLUSTER)
    env = {
        **os.environ,
        "HF_HOME": str(tiny_hf_home),
        "TANDEM_HOME": str(folder / "home"),
        "PYTHONUNBUFFERED": "1",
    }  # each line as it is printed: the test acts on them
    env.pop("VLLM_API_KEY", None)
    return folder, env


@pytest.fixture(scope="module")
def slow_probe_env(files):
    """The environment with an ``nvidia-smi`` that answers after 3 s, as a real host's driver
    can: it holds the preflight inside its throw-away namespaces, so a signal sent once they are
    built lands there on a machine of any speed (on an idle one the whole preflight takes less
    than the half second ``interrupt`` waits)."""
    folder, env = files
    bin_dir = folder / "slow-bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\nsleep 3\nexit 9\n")
    tool.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


def namespaces(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def interrupt(
    argv: list[str], env: dict, *, when: str, sig: int, timeout_s: float = 300
) -> tuple[int, str, int]:
    """Run a tandem command, send ``sig`` once its output shows ``when``; (code, output, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", *argv],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    seen = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        seen.append(line)
        if when in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        pytest.fail(f"never reached {when!r}:\n{''.join(seen)}")
    time.sleep(0.5)
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + rest, proc.pid


def up_argv(folder: Path, *extra: str) -> list[str]:
    return ["up", str(folder / "recipe.yaml"), "--cluster", str(folder / "cluster.yaml"), *extra]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_preflight_removes_its_namespaces_before_exit(files, slow_probe_env, sig):
    folder, _ = files
    code, out, pid = interrupt(
        up_argv(folder), slow_probe_env, when="built throw-away namespaces", sig=sig
    )
    assert code != 0 and "interrupted" in out, out
    assert namespaces(f"tdm-chk{pid}-") == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_ranks_boot_stops_them_and_forgets_the_state(files, sig):
    folder, env = files
    code, out, _ = interrupt(up_argv(folder, "--skip-checks"), env, when="started rank 0", sig=sig)
    said = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else sig.name
    assert code != 0 and f"interrupted by {said}: stopping every rank" in out, out
    assert "start-up failed" not in out, out
    assert marked_processes(NAME) == {}
    assert namespaces(f"tdm-{NAME}-") == []
    assert not (folder / "home" / "deployments" / NAME / "state.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_check_fabric_removes_its_namespaces(files, slow_probe_env, sig):
    folder, _ = files
    argv = [
        "check",
        str(folder / "recipe.yaml"),
        "--cluster",
        str(folder / "cluster.yaml"),
        "--fabric",
    ]
    code, out, pid = interrupt(argv, slow_probe_env, when="built throw-away namespaces", sig=sig)
    assert code != 0, out
    assert namespaces(f"tdm-chk{pid}-") == []


def test_what_sigkill_leaves_the_next_command_removes_and_up_comes_up(files, slow_probe_env):
    folder, env = files
    removed = f"removing what a killed check of '{NAME}' left"
    _, _, check_pid = interrupt(
        [
            "check",
            str(folder / "recipe.yaml"),
            "--cluster",
            str(folder / "cluster.yaml"),
            "--fabric",
        ],
        slow_probe_env,
        when="built throw-away namespaces",
        sig=signal.SIGKILL,
    )
    assert namespaces(f"tdm-chk{check_pid}-")
    _, out, preflight_pid = interrupt(
        up_argv(folder), slow_probe_env, when="built throw-away namespaces", sig=signal.SIGKILL
    )
    assert removed in out and namespaces(f"tdm-chk{check_pid}-") == [], out
    assert namespaces(f"tdm-chk{preflight_pid}-")
    _, out, up_pid = interrupt(
        up_argv(folder, "--skip-checks"), env, when="started rank 0", sig=signal.SIGKILL
    )
    assert removed in out and namespaces(f"tdm-chk{preflight_pid}-") == [], out
    assert marked_processes(NAME)  # the killed up's ranks boot on
    up = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *up_argv(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert (
            f"an earlier `up` of '{NAME}' (pid {up_pid}) was killed before it became ready"
            in up.stdout
        )
        assert "ready at" in up.stdout
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "down", NAME],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert marked_processes(NAME) == {} and namespaces(f"tdm-{NAME}-") == []
