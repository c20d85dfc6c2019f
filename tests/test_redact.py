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
from factories import launched_local_state

from tandem.backends.bundle import write_bundle
from tandem.backends.state import DeploymentDir, GroupState
from tandem.cli import main
from tandem.errors import SpecError
from tandem.files import open_private
from tandem.operations.supervisor import EventLog
from tandem.rankplan import plan_ranks
from tandem.redact import REDACTED, Redactor, is_secret, looks_like_secret_value
from tandem.render import renderer_for
from tandem.spec.loading import load_cluster, load_deployment
from tandem.spec.recipe import Engine
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
        ("--token", True),
        ("--client-secret", True),
        ("--auth-token", True),
        ("--password", True),
        ("--token-ids", False),
        ("--return-tokens-as-token-ids", False),
        ("--ssl-keyfile", False),
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


UNKNOWN = "Zq7x-secret-nobody-exported-42"
"""A secret no environment holds: only its place in the text can give it away."""
SHAPES = [
    f"GET http://user:{UNKNOWN}@10.0.0.1:8000/v1/models",
    f"git clone https://{UNKNOWN}@example.com/repo",
    f"env HF_TOKEN={UNKNOWN} vllm serve m",
    f"DB_PASSWORD={UNKNOWN} run",
    f"AWS_SECRET_ACCESS_KEY={UNKNOWN} run",
    f"kubectl --token={UNKNOWN} get pods",
    f"kubectl --token {UNKNOWN} get pods",
    f"login --client-secret {UNKNOWN}",
    f"login --auth-token={UNKNOWN}",
    f"https://x/?token={UNKNOWN}&page=2",
]


@pytest.mark.parametrize("line", SHAPES)
def test_secret_shaped_strings_are_found_without_knowing_the_value(line):
    safe = Redactor().text(line)
    assert UNKNOWN not in safe and REDACTED in safe
    assert safe.split(REDACTED)[0] == line.split(UNKNOWN)[0]  # the rest stays: user, flag, name


@pytest.mark.parametrize(
    "text",
    [
        "ssh://git@github.com/org/repo",
        "see https://example.com/a?b=1 and http://127.0.0.1:8000/v1",
        "HF_TOKEN_PATH=/run/secrets/hf TOKENIZERS_PARALLELISM=false",
        "SamplingParams(stop_token_ids=[], max_tokens=16)",
        "tandem bench --token-ids --max-num-batched-tokens 8192",
        "export HF_TOKEN=$HF_TOKEN; curl http://u:${PASS}@h",
    ],
)
def test_texts_without_a_secret_are_kept(text):
    assert Redactor().text(text) == text


def test_a_secret_flag_without_a_value_hides_no_flag():
    argv = ["kubectl", "--token", "--v=2", "--client-secret", "s3", "--token-ids", "1"]
    assert Redactor().argv(argv) == [
        "kubectl",
        "--token",
        "--v=2",
        "--client-secret",
        REDACTED,
        "--token-ids",
        "1",
    ]


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
    state = GroupState(
        name="s",
        backend="local",
        recipe={"env": {"HF_TOKEN": "plain"}},
        cluster={},
        endpoint="http://127.0.0.1:1",
        model="m",
        phases=[PhaseMark(phase="ready", elapsed_s=1, detail=f"sent Bearer {API_KEY}")],
    )
    state.save()
    path = DeploymentDir.of("s").state_file
    text = path.read_text()
    assert "plain" not in text and API_KEY not in text and REDACTED in text
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert json.loads(text)["name"] == "s"


def test_events_log_is_private_and_redacted(caller):
    log = EventLog("evt")
    log(f"restart 1/3: rank 0 exited, its command had --token={UNKNOWN}")
    assert mode(log.path) == 0o600 and mode(log.path.parent) == 0o700
    assert log.path.read_text().endswith(f"--token={REDACTED}\n")


def test_render_out_files_are_redacted(caller, monkeypatch):
    """Whatever a target's files hold, they are written through ``tandem.files``."""
    leaky = {"prometheus.yml": f"authorization: {{credentials: {API_KEY}}}\n"}
    monkeypatch.setattr("tandem.cli.render.files_renderer_for", lambda target: lambda p, d: leaky)
    out = caller / "prom"
    assert main(["render", "tiny-local", "--target", "prometheus", "--out", str(out)]) == 0
    assert (out / "prometheus.yml").read_text() == f"authorization: {{credentials: {REDACTED}}}\n"


CLUSTER = "name: c\ntransport: {transport}\nnodes:\n  - {{name: n0, address: 10.0.0.1}}\n{extra}"


@pytest.mark.parametrize(
    "transport,extra,field",
    [
        ("k8s", f"kubernetes: {{kubectl: 'kubectl --token={UNKNOWN}'}}\n", "kubernetes.kubectl"),
        ("k8s", f"kubernetes: {{kubectl: 'kubectl --token {UNKNOWN}'}}\n", "kubernetes.kubectl"),
        ("ssh", f"ssh: {{vllm_command: 'env HF_TOKEN={UNKNOWN} vllm'}}\n", "ssh.vllm_command"),
        (
            "ssh",
            f"ssh: {{docker_command: 'docker --config https://u:{UNKNOWN}@r'}}\n",
            "ssh.docker_command",
        ),
    ],
)
def test_a_command_field_with_an_inline_secret_is_refused(tmp_path, transport, extra, field):
    """Fields that become command lines refuse secrets as ``env`` does, naming the field and
    the fix, and never echoing the secret."""
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(transport=transport, extra=extra))
    with pytest.raises(SpecError) as info:
        load_cluster(path)
    problems = {p.field: p for p in info.value.problems}
    assert field in problems, problems
    assert "holds a secret inline" in problems[field].message
    assert "environment of `tandem up`" in (problems[field].hint or "")
    assert UNKNOWN not in str(info.value)


def test_extra_args_with_an_inline_secret_are_refused():
    with pytest.raises(ValueError, match="holds a secret inline") as info:
        Engine(extra_args=["--seed", "0", "--client-secret", UNKNOWN])
    assert UNKNOWN not in str(info.value)
    assert Engine(extra_args=["--seed", "0"]).extra_args == ["--seed", "0"]


def launched_state(caller: Path) -> GroupState:
    """A local deployment's state as `up` leaves it, its rank logs holding the caller's secrets."""
    state = launched_local_state(
        caller,
        f"INFO args: --api-key {API_KEY}\nGET /v1/models Authorization: Bearer "
        f"{API_KEY}\nhub token {HF_TOKEN}\nINFO ready\n",
    )
    with open_private(DeploymentDir.of(state.deployment_name).events, "a") as handle:
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
