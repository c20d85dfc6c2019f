"""Workloads: the load points of a run, their conversations and their arrival schedules. Pure.

A *load point* is one measured setting: a closed-loop concurrency (``c4``: four conversations
always in flight), an open-loop request rate (``r2``: two conversations/s on a seeded Poisson or
gamma schedule), or the long-context prefill case (``long``: one stream with a prompt filling
the model's context). ``plan_load_points`` derives them from a ``BenchConfig``; with ``rounds``
the whole ladder is measured that many times, round after round (``schedule``), so a drift of
the server shows as spread between rounds, not as a difference between points.

With ``depths`` (the context-depth sweep, llama-benchy's ``--depth``) every concurrency point
is measured at each depth, depth by depth (``c1-d0``, ``c1-d4096``...): each request carries a
context of that many tokens of its own in front of its prompt, as llama-benchy sends its
"previous conversation" (the system message), so what a long context costs prefill and decode
shows without the prefix cache serving it.

A *conversation* is what one slot sends: its user turns one after the other, each turn carrying
the earlier turns and the server's answers (multi-turn chat; one turn by default), all after an
optional system prompt shared by its *prefix group* (the shared-prefix workload: request i of a
point is in group i mod G, so G prefixes of P tokens each are computed once and then served
from the prefix cache).

Arrival schedule (``arrival_offsets_s``), as vLLM's ``get_request``: inter-arrival gaps are
drawn from Gamma(shape=burstiness, scale=1/(rate·burstiness)) with a seeded RNG (burstiness 1 is
Poisson; ``inf`` a constant rate), accumulated, and rescaled so the last arrival falls at
n/rate. A concurrency point sends everything at offset 0 and lets the slots gate it.

Prompts: with a prompt file, its rows (``tandem.bench.datasets``), sampled with the seed.
Otherwise fixed-length synthetic prompts: token ids drawn (seeded, per request and turn, so no
two share a prefix and the prefix cache cannot help, unless a shared prefix is asked for) from
the ids of a seeded word text as the server tokenizes it, sent as their text (fitted to length
by the load generator) unless ``prompt_token_ids`` asks for the ids. Every round and point draws
its own prompts and prefixes (seeded from its place in the schedule), so none is served from an
earlier one's cache.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.config import BenchConfig
from tandem.bench.timed_request import Exchange, Prompt
from tandem.errors import SpecError

CHAT_TEMPLATE_MARGIN_TOKENS = 64
"""Tokens left free for the chat template when a prompt is sized to fill the context."""

_WORDS = [
    "serve",
    "model",
    "node",
    "rank",
    "leader",
    "worker",
    "cache",
    "token",
    "prefill",
    "decode",
    "batch",
    "queue",
    "engine",
    "tensor",
    "expert",
    "layer",
    "kernel",
    "memory",
    "network",
    "latency",
    "stream",
    "window",
    "budget",
    "schedule",
    "river",
    "mountain",
    "garden",
    "window",
    "silver",
    "orange",
    "marble",
    "quiet",
    "rapid",
    "gentle",
    "hollow",
    "amber",
    "lantern",
    "harbor",
    "meadow",
    "canyon",
    "pebble",
    "thunder",
    "velvet",
    "compass",
    "falcon",
    "meridian",
]


class LoadPoint(BaseModel):
    """One measured setting of a run."""

    # burstiness may be inf (constant rate): JSON has no infinity, so it is written "Infinity"
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    label: str = Field(description="`c4`, `r2.5`, `long`: unique within a run.")
    kind: Literal["concurrency", "rate", "long-context"]
    concurrency: int | None = Field(default=None, description="Requests in flight; None: no cap.")
    rate_rps: float | None = Field(default=None, description="Open-loop arrival rate.")
    burstiness: float | None = None
    requests: int = Field(description="Conversations sent (requests, when each has one turn).")
    input_tokens: int
    output_tokens: int
    depth_tokens: int = Field(
        default=0, description="Context in front of every prompt (the depth sweep), tokens."
    )
    round: int = Field(default=1, description="Which repetition of the ladder, from 1.")


@dataclass(frozen=True)
class Conversation:
    """The user's side of one conversation; the answers are the server's, added as they come.

    ``prompt_tokens`` is the first turn's length as the server's tokenizer counts it, when it was
    measured (prompts from a file).
    """

    turns: tuple[Prompt, ...]
    system: str | None = None
    group: int | None = None
    prompt_tokens: int | None = None

    def prompt(self, turn: int, history: tuple[Exchange, ...] = ()) -> Prompt:
        """Turn ``turn`` (from 0) as sent: the system prompt, the earlier exchanges, the turn."""
        return replace(self.turns[turn], system=self.system, history=history)


def schedule(points: list[LoadPoint], rounds: int) -> list[LoadPoint]:
    """Every point of every round, in the order measured: the whole ladder, then again."""
    return [p.model_copy(update={"round": r}) for r in range(1, rounds + 1) for p in points]


def plan_load_points(config: BenchConfig, max_model_len: int | None) -> list[LoadPoint]:
    """The load points of a run, in the order they are measured.

    Raises:
        SpecError: the long-context case was asked for but the server does not say its
            max_model_len, or input + output tokens do not fit it.
    """
    points: list[LoadPoint] = []
    io = {"input_tokens": config.input_tokens, "output_tokens": config.output_tokens}
    front = max([config.prefix_tokens, *config.depths])
    longest = front + config.turns * (config.input_tokens + config.output_tokens)
    if max_model_len is not None and not config.prompt_file and longest > max_model_len:
        parts = ["input_tokens + output_tokens"]
        if config.turns > 1:
            parts = [f"{config.turns} turns × ({parts[0]})"]
        if config.prefix_tokens or config.depths:
            parts.insert(0, "the deepest depth" if config.depths else "prefix_tokens")
        raise SpecError(
            f"{' + '.join(parts)} = {longest}: the last prompt and its answer do not fit the "
            f"model's max_model_len {max_model_len}",
            field="input_tokens",
            hint="lower --input-tokens or --output-tokens"
            + (", --turns" if config.turns > 1 else "")
            + (", --prefix-tokens" if config.prefix_tokens else "")
            + (", --depths" if config.depths else ""),
        )
    depths: list[int | None] = [*config.depths] or [None]
    for depth in depths:
        for c in config.concurrency:
            points.append(
                LoadPoint(
                    label=f"c{c}" if depth is None else f"c{c}-d{depth}",
                    kind="concurrency",
                    concurrency=c,
                    requests=config.requests or max(8, 4 * c),
                    depth_tokens=depth or 0,
                    **io,
                )
            )
    for rate in config.rates_rps:
        points.append(
            LoadPoint(
                label=f"r{rate:g}",
                kind="rate",
                rate_rps=rate,
                burstiness=config.burstiness,
                concurrency=config.max_concurrency,
                requests=config.requests or 16,
                **io,
            )
        )
    if config.long_context:
        if max_model_len is None:
            raise SpecError(
                "the server does not report max_model_len, so the long-context "
                "prompt cannot be sized",
                field="long_context",
                hint="drop --long-context, or give --input-tokens yourself",
            )
        margin = CHAT_TEMPLATE_MARGIN_TOKENS if config.endpoint == "chat" else 1
        long_in = max_model_len - config.output_tokens - margin
        if long_in < 1:
            raise SpecError(
                f"output_tokens {config.output_tokens} leaves no room for a prompt "
                f"in max_model_len {max_model_len}",
                field="output_tokens",
            )
        points.append(
            LoadPoint(
                label="long",
                kind="long-context",
                concurrency=1,
                requests=config.long_context_requests,
                input_tokens=long_in,
                output_tokens=config.output_tokens,
            )
        )
    return points


def arrival_offsets_s(
    n: int, rate_rps: float | None, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """When each of n requests should be sent, seconds from the load point start.

    ``rate_rps`` None or inf: all at 0. ``burstiness`` inf: constant spacing 1/rate.

    Usage:
        arrival_offsets_s(4, 2.0, burstiness=math.inf)   # [0.5, 1.0, 1.5, 2.0]
    """
    if n <= 0:
        return []
    if rate_rps is None or math.isinf(rate_rps):
        return [0.0] * n
    if math.isinf(burstiness):
        return [(i + 1) / rate_rps for i in range(n)]
    rng = random.Random(seed)
    scale = 1.0 / (rate_rps * burstiness)
    offsets, t = [], 0.0
    for _ in range(n):
        t += rng.gammavariate(burstiness, scale)
        offsets.append(t)
    target = n / rate_rps
    factor = target / offsets[-1] if offsets[-1] > 0 else 1.0
    return [o * factor for o in offsets]


def synthetic_text(seed: int, words: int) -> str:
    """Seeded text of ``words`` words, the source of synthetic prompts' token ids."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def sample_token_ids(pool: list[int], n: int, seed: int, index: int) -> list[int]:
    """n token ids drawn from ``pool`` for request ``index``: different for every request."""
    if not pool:
        raise ValueError("empty token pool")
    rng = random.Random(seed * 1_000_003 + index)
    return [pool[rng.randrange(len(pool))] for _ in range(n)]
