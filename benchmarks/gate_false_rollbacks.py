"""False rollbacks of the upgrade gate, its wall time, and the speed of a revision right after
its start, on the real model at the default limits.

Brings up ``smollm2-local`` (the real SmolLM2-135M-Instruct, pipeline parallel 2 across two
ranks of vLLM-CPU) in a scratch ``TANDEM_HOME`` and upgrades it ``--upgrades`` times to
revisions that change nothing that matters, in turn: a vLLM flag with no effect on answers
(``--max-log-len 200``), an environment variable, and the recipe before it again. Each upgrade
runs the whole gate at its default limits, the bench on (``tandem upgrade NAME --recipe R``).

For each upgrade it prints the outcome (a rollback here is a false one), the upgrade's wall
time, the gate's (from the new revision's first check to its verdict), the answers check's
figures, and the bench rounds of both sides: the median TPOT of each round, the first being
the warm-up the verdict does not count, so the slowdown a fresh revision shows is seen where
it falls. ``--json FILE`` keeps the figures.

``--garbling`` then upgrades, still at the default limits, to each revision of
``tests/garbling.py`` (a model config, weights under a valid layout, a chat template that loses
the conversation, a numeric precision that degrades): each must be rolled back **by the answers
check**, its evidence printed, and after each rollback the running revision must answer the
same greedy tokens as before the first (``GREEDY_PROMPTS``, token by token).

Run it under the heavy lock (one start per upgrade, ~3-4 min each on two cores):

    flock /tmp/tandem-heavy.lock .venv/bin/python benchmarks/gate_false_rollbacks.py --upgrades 3
    flock /tmp/tandem-heavy.lock .venv/bin/python benchmarks/gate_false_rollbacks.py \
        --upgrades 6 --garbling --json gate.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tandem import files
from tandem.bench.compare import load_summary
from tandem.bench.rounds import values_over_rounds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the garbling revisions the engine tests use
import garbling  # noqa: E402

NAME = "smollm2-local"
TANDEM = [sys.executable, "-m", "tandem.cli"]
RECIPE = ROOT / "src/tandem/recipes/smollm2-local.yaml"
GREEDY_PROMPTS = [
    "The capital of Germany is",
    "def fibonacci(n):",
    "Water boils at",
    "La capitale de la France est",
    "1, 2, 3, 5, 8, 13,",
    "The three primary colours are",
]
"""Asked of the running revision before the first garbling upgrade and after each rollback."""


def tandem(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode:
        raise SystemExit(f"tandem {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def benign_recipes(folder: Path) -> list[Path]:
    """Three revisions of the built-in recipe that change nothing its answers or speed depend on."""
    text = RECIPE.read_text()
    flag = text.replace("extra_args: [", 'extra_args: ["--max-log-len", "200", ', 1)
    env = text.replace("  DO_NOT_TRACK: 1\n", "  DO_NOT_TRACK: 1\n  TANDEM_NOTE: no effect\n", 1)
    assert flag != text and env != text, "the built-in recipe changed: update the benchmark"
    paths = []
    for tag, body in (("flag", flag), ("env", env), ("same", text)):
        paths.append(folder / f"{tag}.yaml")
        paths[-1].write_text(body)
    return paths


def garbling_recipes(folder: Path, hf_home: Path) -> dict[str, Path]:
    """The built-in recipe at each garbling revision of ``tests/garbling.py``."""
    text = RECIPE.read_text()
    paths = {}
    for tag, (old, new) in garbling.recipe_changes(hf_home, folder).items():
        assert old in text, f"{old!r}: the built-in recipe changed; update the benchmark"
        paths[tag] = folder / f"garbling-{tag}.yaml"
        paths[tag].write_text(text.replace(old, new, 1))
    return paths


def greedy_tokens(env: dict[str, str]) -> list[list[str]]:
    """The running revision's greedy tokens for ``GREEDY_PROMPTS``, one at a time."""
    status = json.loads(tandem("status", NAME, "--json", env=env).stdout)
    answers = []
    with httpx.Client(base_url=status["endpoint"], timeout=120) as client:
        for prompt in GREEDY_PROMPTS:
            body = {"model": status["model"], "prompt": prompt, "max_tokens": 24,
                    "temperature": 0, "logprobs": 1}  # fmt: skip
            choice = client.post("/v1/completions", json=body).raise_for_status().json()
            answers.append(choice["choices"][0]["logprobs"]["tokens"])
    return answers


def timed_upgrade(recipe: Path, env: dict[str, str]) -> tuple[int, list[tuple[float, str]]]:
    """``tandem upgrade`` with each printed line stamped as it arrives."""
    started = time.monotonic()
    process = subprocess.Popen(
        [*TANDEM, "upgrade", NAME, "--recipe", str(recipe)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines = [(time.monotonic() - started, line.rstrip()) for line in process.stdout]
    return process.wait(), lines


def round_tpots(folder: Path) -> list[float]:
    """Each round's median TPOT (ms) of the bench run in ``folder``, the warm-up first."""
    result = load_summary(folder)
    label = result.labels()[0]
    return [round(v * 1000, 1) for v in values_over_rounds(result.rounds_of(label), "tpot_p50_s")]


def figures(home: Path, number: int, code: int, lines: list[tuple[float, str]]) -> dict:
    gate = [t for t, line in lines if "gate:" in line]
    said = [line for _, line in lines]
    work = next(home.glob(f"**/{NAME}/upgrades/from-{number}"))
    attempt = max(work.glob("to-*"), key=lambda p: p.stat().st_mtime)
    answers = next((line for line in said if "gate: smoke answers" in line), "")
    verdict = next((line for line in said if "gate: bench" in line), "")
    return {
        "from": number,
        "outcome": "upgraded" if code == 0 else "rolled back",
        "upgrade_s": round(lines[-1][0], 1) if lines else None,
        "gate_s": round(gate[-1] - gate[0], 1) if len(gate) > 1 else None,
        "answers": answers.split("gate: smoke answers ", 1)[-1][:160],
        "speed": verdict.split("gate: bench ", 1)[-1][:240],
        "baseline_rounds_ms": round_tpots(attempt / "baseline"),
        "new_rounds_ms": round_tpots(attempt / "group-0" / "bench"),
        "failed_because": next((line for line in said if "failed (" in line), None),
    }


def garbled(env: dict[str, str], recipes: dict[str, Path]) -> list[dict]:
    """Each garbling upgrade's outcome, the check that failed it, its evidence, and whether
    the revision running after the rollback answers the same greedy tokens as before."""
    before = greedy_tokens(env)
    rows = []
    for tag, recipe in recipes.items():
        code, lines = timed_upgrade(recipe, env)
        said = [line for _, line in lines]
        failed = next((line for line in said if "failed (" in line), "")
        after = greedy_tokens(env)
        rows.append({
            "revision": tag,
            "outcome": "upgraded" if code == 0 else "rolled back",
            "by_answers": "smoke answers" in failed,
            "failed_because": failed[:300],
            "evidence": [line for line in said if "gate: smoke answers" in line][:1],
            "upgrade_s": round(lines[-1][0], 1) if lines else None,
            "same_greedy_tokens_after": after == before,
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upgrades", type=int, default=3, help="Benign upgrades to run.")
    parser.add_argument("--garbling", action="store_true", help="Then each garbling revision.")
    parser.add_argument("--hf-home", type=Path, default=Path(tempfile.gettempdir()) / "tandem-hf")
    parser.add_argument("--json", type=Path, help="Write the figures here too.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-false-rollbacks-"))
    env = {**os.environ, "TANDEM_HOME": str(work / "home"), "HF_HOME": str(args.hf_home)}
    env.pop("VLLM_API_KEY", None)
    recipes = benign_recipes(work)
    tandem("model", "real", "--hf-home", str(args.hf_home), env=env)
    garbling_paths = garbling_recipes(work, args.hf_home) if args.garbling else {}
    tandem("up", NAME, env=env)
    rows, garbling_rows = [], []
    try:
        for i in range(args.upgrades):
            running = json.loads(tandem("status", NAME, "--json", env=env).stdout)["revision"]
            code, lines = timed_upgrade(recipes[i % len(recipes)], env)
            rows.append(figures(work / "home", running, code, lines))
            print(json.dumps(rows[-1]), flush=True)
        garbling_rows = garbled(env, garbling_paths) if garbling_paths else []
    finally:
        subprocess.run([*TANDEM, "down", NAME], env=env, capture_output=True, timeout=300)
    false = sum(r["outcome"] != "upgraded" for r in rows)
    gates = sorted(r["gate_s"] for r in rows if r["gate_s"] is not None)
    print(f"false rollbacks: {false} of {len(rows)} benign upgrades at the default limits")
    if gates:
        print(
            f"gate wall time: median {gates[len(gates) // 2]} s (min {gates[0]}, max {gates[-1]})"
        )
    if garbling_rows:
        caught = sum(r["outcome"] == "rolled back" and r["by_answers"] for r in garbling_rows)
        same = sum(r["same_greedy_tokens_after"] for r in garbling_rows)
        print(
            f"garbling revisions rolled back by the answers check: {caught} of "
            f"{len(garbling_rows)}; the same greedy tokens after the rollback: {same} of "
            f"{len(garbling_rows)}"
        )
    if args.json:
        files.write_json(
            args.json, {"upgrades": rows, "false_rollbacks": false, "garbling": garbling_rows}
        )


if __name__ == "__main__":
    main()
