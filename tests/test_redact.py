"""The one redaction path: no secret leaves tandem in plain text.

Secrets are refused in recipes and clusters (``test_bad_input.py``); what still carries one — the
caller's ``VLLM_API_KEY``/``HF_TOKEN`` as ranks get it at launch, a rank's log, an old state
file — goes through ``tandem.redact`` in every rendered form, ``up --dry-run``, the state file,
``tandem logs``, the log copies and the support bundle, which is mode 0600.
"""

from __future__ import annotations

import json
import stat
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.backends.bundle import write_bundle
from tandem.backends.launch import new_state, record_rank
from tandem.backends.state import DeploymentState, open_private, private_dir
from tandem.cli import main
from tandem.rankplan import plan_ranks
from tandem.redact import REDACTED, Redactor, is_secret, looks_like_secret_value
from tandem.render import renderer_for
from tandem.spec.loading import load_deployment
from tandem.supervisor import EventLog
from tandem.vllm_log import PhaseMark

ROOT = Path(__file__).resolve().parents[1]
EKS = str(ROOT / "examples" / "dgx-spark-eks.yaml")
API_KEY = "caller-api-key-0123456789"
HF_TOKEN = "caller-hf-token-9876543210"


@pytest.fixture
def caller(monkeypatch, tmp_path):
    """The caller's environment holds an API key and an HF token; state lives in tmp_path."""
    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    "name,secret",
    [
        ("HF_TOKEN", True),
        ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("--api-key", True),
        ("--api_key", True),
        ("--hf-token", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("HF_TOKEN_PATH", False),
        ("VLLM_HOST_IP", False),
        ("--max-model-len", False),
        ("NCCL_IB_HCA", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret(name) is secret


LEAKS = [
    f"Authorization: Bearer {API_KEY}",
    f"--api-key {API_KEY}",
    f"--api-key={API_KEY}",
    f"non-default args: {{'api_key': '{API_KEY}'}}",
    f"token={HF_TOKEN}",
    "hf_ABCDEFGHIJKLMNOPQRSTUVWX in the URL",
    "sk-abcdefghijklmnopqrstuvwx",
    "bearer abc.def-ghi_jkl",
]


@pytest.mark.parametrize("line", LEAKS)
def test_texts_lose_every_secret_form(caller, line):
    safe = Redactor.for_caller().text(line)
    assert REDACTED in safe
    for secret in (
        API_KEY,
        HF_TOKEN,
        "hf_ABCDEFGHIJKLMNOPQRSTUVWX",
        "sk-abcdefghijklmnopqrstuvwx",
        "abc.def-ghi_jkl",
    ):
        assert secret not in safe


def test_shapes_of_credentials():
    assert looks_like_secret_value("hf_abcdefghijklmnopqrstuv")
    assert not looks_like_secret_value("deepseek-ai/DeepSeek-V4-Flash")


def leaky_plan():
    """The seed's plan with the caller's secrets in the leader's environment and argv, as a
    launch would add them (the recipe itself may not hold them)."""
    deployment = load_deployment("deepseek-v4-flash-dspark", EKS)
    plan = plan_ranks(deployment)
    leader = plan.ranks[0]
    leader = leader.model_copy(
        update={
            "env": {**leader.env, "VLLM_API_KEY": API_KEY, "SOME_URL": f"https://x/?t={HF_TOKEN}"},
            "argv": [*leader.argv, "--api-key", API_KEY],
        }
    )
    return plan.model_copy(update={"ranks": [leader, *plan.ranks[1:]]}), deployment


@pytest.mark.parametrize(
    "target,fmt",
    [
        ("process", "shell"),
        ("process", "json"),
        ("docker", "shell"),
        ("docker", "json"),
        ("k8s", "yaml"),
        ("k8s", "json"),
    ],
)
def test_every_rendered_form_is_redacted(caller, target, fmt):
    plan, deployment = leaky_plan()
    text = renderer_for(target)(plan, deployment, fmt)
    assert API_KEY not in text and HF_TOKEN not in text


def test_up_dry_run_is_redacted(caller):
    cluster = caller / "loopback.yaml"
    cluster.write_text(
        "name: here\ntransport: local\nlocal: {isolation: loopback}\nnodes:\n"
        "  - {name: n0, address: 127.0.0.1}\n  - {name: n1, address: 127.0.0.1}\n"
    )
    recipe = caller / "recipe.yaml"
    recipe.write_text(
        (ROOT / "src/tandem/recipes/tiny-local.yaml")
        .read_text()
        .replace("DO_NOT_TRACK: 1", f"DO_NOT_TRACK: 1\n  SOME_URL: 'https://x/?t={HF_TOKEN}'")
    )
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main(["up", str(recipe), "--cluster", str(cluster), "--dry-run"])
    output = streams[0].getvalue().decode()
    assert code == 0 and "vllm" in output and "SOME_URL=" in output
    assert HF_TOKEN not in output


def test_state_file_is_private_and_redacted(caller):
    state = DeploymentState(
        name="s",
        backend="local",
        recipe={"env": {"HF_TOKEN": "plain"}},
        cluster={},
        endpoint="http://127.0.0.1:1",
        model="m",
        phases=[PhaseMark(phase="ready", elapsed_s=1, detail=f"sent Bearer {API_KEY}")],
    )
    state.save()
    path = state.directory.state_file
    text = path.read_text()
    assert "plain" not in text and API_KEY not in text and REDACTED in text
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert json.loads(text)["name"] == "s"


def test_private_files_and_folders(tmp_path):
    folder = private_dir(tmp_path / "a" / "b")
    with open_private(folder / "log", "ab") as handle:
        handle.write(b"x")
    (folder / "old").write_text("y")
    (folder / "old").chmod(0o644)
    with open_private(folder / "old", "a") as handle:
        handle.write("z")
    assert mode(folder) == 0o700 and mode(folder / "log") == 0o600
    assert mode(folder / "old") == 0o600 and (folder / "old").read_text() == "yz"


def test_events_log_is_private(caller):
    log = EventLog("evt")
    log("supervising")
    assert mode(log.path) == 0o600 and mode(log.path.parent) == 0o700


def launched_state(caller: Path) -> DeploymentState:
    """A local deployment's state as `up` leaves it, its rank logs holding the caller's secrets."""
    cluster = caller / "loopback.yaml"
    cluster.write_text(
        "name: here\ntransport: local\nlocal: {isolation: loopback}\nnodes:\n"
        "  - {name: n0, address: 127.0.0.1}\n  - {name: n1, address: 127.0.0.1}\n"
    )
    deployment = load_deployment("tiny-local", cluster)
    plan = plan_ranks(deployment)
    state = new_state(plan, deployment, backend="local")
    logs = private_dir(state.directory.logs)
    for rank in plan.ranks:
        log = logs / f"rank{rank.rank}.log"
        log.write_text(
            f"INFO args: --api-key {API_KEY}\nGET /v1/models Authorization: Bearer "
            f"{API_KEY}\nhub token {HF_TOKEN}\nINFO ready\n"
        )
        record_rank(state, rank, log=str(log), pid=None)
    with open_private(state.directory.events, "a") as handle:
        handle.write(f"restart: leader answered 401 to key {API_KEY}\n")
    return state


def test_support_bundle_is_private_and_scrubbed(caller):
    state = launched_state(caller)
    path = write_bundle(state.name, caller)
    assert mode(path) == 0o600
    with tarfile.open(path) as archive:
        members = {
            m.name.split("/", 1)[1]: archive.extractfile(m).read().decode()
            for m in archive.getmembers()
        }
    assert {"events.log", "ranks/rank0.log", "ranks/rank1.log", "state.json"} <= set(members)
    for name, text in members.items():
        assert API_KEY not in text and HF_TOKEN not in text, name
    assert "INFO ready" in members["ranks/rank0.log"]
    assert "Bearer REDACTED" in members["ranks/rank0.log"]
    assert "--api-key REDACTED" in members["ranks/rank1.log"]
    assert "key REDACTED" in members["events.log"]


def test_logs_command_prints_no_secret(caller):
    state = launched_state(caller)
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main(["logs", state.name, "--rank", "0"])
    output = streams[0].getvalue().decode()
    assert code == 0 and "INFO ready" in output
    assert API_KEY not in output and HF_TOKEN not in output


def test_an_error_message_never_echoes_a_caller_secret(caller):
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main(["render", f"no-recipe-{API_KEY}"])
    assert code == 2 and API_KEY not in streams[1].getvalue().decode()


@pytest.mark.parametrize(
    "prose",
    [
        "pass --api-key or set VLLM_API_KEY",
        "use --api-key.",
        "Bearer token for a server started with an API key",
    ],
)
def test_prose_about_keys_is_kept(prose):
    assert Redactor().text(prose) == prose


@pytest.mark.parametrize("target", ["process", "docker", "k8s"])
def test_rendering_a_recipe_without_secrets_changes_nothing(target, monkeypatch):
    """The redaction path keeps every legitimate byte (placeholders in advice included)."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    plan, deployment = leaky_plan()
    plan = plan_ranks(deployment)
    text = renderer_for(target)(plan, deployment, "json")
    assert REDACTED not in text
    assert REDACTED not in renderer_for("k8s")(plan, deployment, "yaml")
