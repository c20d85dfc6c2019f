"""The conversations of every load point, built before it starts (untimed) with the server's
own tokenizer, so a prompt is as long as asked, as the server counts it.

- Synthetic prompts: token ids drawn per request and turn from a pool (the ids of a seeded word
  text, ``/tokenize``d), sent as token ids or as text fitted to length (``_fitted_text``).
- Shared prefix: each of ``prefix_groups`` prefixes is drawn the same way, once per point, and
  sent as the system message (chat) or in front of the prompt and a blank line (completions
  text); as token ids, its ids go in front of the prompt's.
- Depth sweep: each request's context of ``depth_tokens`` is drawn the same way, its own (no
  two requests share one, so the prefix cache cannot serve it), and sent where a shared prefix
  goes.
- Prompt file: its rows in a seeded order, each measured with ``/tokenize`` as the endpoint
  will count it (chat: through the chat template); rows that cannot fit max_model_len with
  their answers are left out and counted. Point k of the run takes the next rows in that order
  (``_offsets``), wrapping around (and saying so) when the file has fewer than the run sends.

The long-context point is always one synthetic turn without prefix: it measures prefill alone.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import httpx

from tandem.bench.config import BenchConfig
from tandem.bench.datasets import Dataset, DatasetSummary
from tandem.bench.metrics import LatencyStats
from tandem.bench.timed_request import Exchange, Prompt, count_tokens, detokenize, tokenize
from tandem.bench.workload import Conversation, LoadPoint, sample_token_ids, synthetic_text
from tandem.errors import SpecError

FIT_PASSES = 3
"""Tokenize-and-cut passes that fit a synthetic text prompt to its length (one usually does)."""
POINT_STRIDE = 1_000_000
"""Prompt indices reserved per point: ids of point k's prompts are seeded from k × this on."""
PREFIX_OFFSET = 500_000
"""Where in a point's indices its prefixes are seeded (its prompts stay below)."""
DEPTH_OFFSET = 750_000
"""Where in a point's indices each request's depth context is seeded."""
WARMUP_INDEX = 2**40
"""Where the warm-up's prompts are seeded: beyond any point's."""
_GATE = 8
"""/tokenize and /detokenize calls in flight while prompts are built."""


class PromptSource:
    """Builds each point's conversations against one server.

    Usage:
        source = PromptSource(client, config, "chat", "tiny", max_model_len=1024)
        warnings = await source.prepare(schedule, dataset)
        conversations = await source.conversations(point, key=0)
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        config: BenchConfig,
        endpoint: str,
        model: str,
        max_model_len: int | None,
    ) -> None:
        self.client = client
        self.config = config
        self.endpoint = endpoint
        self.model = model
        self.max_model_len = max_model_len
        self.summary: DatasetSummary | None = None
        self._pool: list[int] | None = None
        self._added_tokens = 0
        """How many tokens the server adds to a text prompt on this endpoint (BOS, say)."""
        self._rows: list[Conversation] = []
        self._offsets: dict[int, int] = {}
        self._sent = 0
        """Conversations the run's points take from the file; the warm-up's come after."""
        self._gate = asyncio.Semaphore(_GATE)

    async def prepare(self, schedule: list[LoadPoint], dataset: Dataset | None) -> list[str]:
        """Fill the token pool and measure the prompt file's rows the run needs; the warnings.

        Raises:
            SpecError: no row of the prompt file fits max_model_len.
        """
        warnings = []
        if dataset is None or any(p.kind == "long-context" for p in schedule):
            warnings += await self._fill_pool()
        if dataset is not None:
            for key, point in enumerate(schedule):
                self._offsets[key] = self._sent
                self._sent += point.requests if point.kind != "long-context" else 0
            warnings += await self._measure(dataset, self._sent + self.config.warmup_requests)
        return warnings

    async def conversations(self, point: LoadPoint, key: int) -> list[Conversation]:
        """The conversations of ``point``, the ``key``-th of the run."""
        if self._rows and point.kind != "long-context":
            start, rows = self._offsets[key], self._rows
            return [rows[(start + i) % len(rows)] for i in range(point.requests)]
        return await self._synthetic(point, key * POINT_STRIDE, point.requests)

    async def warmup(self, point: LoadPoint, n: int) -> list[Prompt]:
        """First turns for the warm-up: rows after all the measured ones, or fresh synthetic."""
        if self._rows and point.kind != "long-context":
            rows = self._rows
            return [rows[(self._sent + i) % len(rows)].prompt(0) for i in range(n)]
        shape = point.model_copy(update={"requests": n})
        return [c.prompt(0) for c in await self._synthetic(shape, WARMUP_INDEX, n)]

    # --- synthetic ------------------------------------------------------------------------

    async def _fill_pool(self) -> list[str]:
        text = synthetic_text(self.config.seed, 2000)
        ids = await tokenize(self.client, self.config.url, self.model, text)
        if not ids:
            return [
                "the server has no /tokenize, so prompt lengths are approximate "
                "(one word per token); prompt tokens are still read from usage"
            ]
        self._pool = sorted(set(ids))
        if self.endpoint == "completions":  # chat leaves special tokens to its template
            counted = await tokenize(
                self.client, self.config.url, self.model, text, add_special_tokens=True
            )
            self._added_tokens = max(0, len(counted or ids) - len(ids))
        return []

    async def _synthetic(self, point: LoadPoint, first: int, n: int) -> list[Conversation]:
        c = self.config
        plain = point.kind == "long-context"
        turns = 1 if plain else c.turns
        groups = 0 if plain or not c.prefix_tokens else c.prefix_groups
        prefixes = await asyncio.gather(
            *(self._ids_or_text(c.prefix_tokens, first + PREFIX_OFFSET + g) for g in range(groups))
        )
        depth = 0 if plain else point.depth_tokens
        contexts = await asyncio.gather(
            *(self._ids_or_text(depth, first + DEPTH_OFFSET + i) for i in range(n if depth else 0))
        )
        # A text prompt's count includes what the server adds, as vLLM's random dataset's does
        body = point.input_tokens - (0 if self._ids else self._added_tokens)
        bodies = await asyncio.gather(
            *(
                self._ids_or_text(max(1, body), first + i * turns + k)
                for i in range(n)
                for k in range(turns)
            )
        )
        conversations = []
        for i in range(n):
            group = i % groups if groups else None
            prefix = prefixes[group] if group is not None else None
            if contexts:
                prefix = contexts[i]
            mine = bodies[i * turns : (i + 1) * turns]
            if self._ids:  # one turn (token ids are completions only), prefix ids in front
                ids = (prefix.token_ids or ()) if prefix else ()
                mine = [Prompt("", ids + (mine[0].token_ids or ()))]
                prefix = None
            conversations.append(
                Conversation(tuple(mine), system=prefix.text if prefix else None, group=group)
            )
        return conversations

    @property
    def _ids(self) -> bool:
        """Prompts go as token ids (completions, asked for, and the server tokenizes)."""
        wanted = self.config.prompt_token_ids and self.endpoint == "completions"
        return wanted and self._pool is not None

    async def _ids_or_text(self, length: int, index: int) -> Prompt:
        seed = self.config.seed
        if self._pool is None:
            return Prompt(synthetic_text(seed * 7919 + index, length))
        ids = sample_token_ids(self._pool, length, seed, index)
        if self._ids:
            return Prompt("", tuple(ids))
        async with self._gate:
            text = await self._fitted_text(ids)
        return Prompt(text if text is not None else synthetic_text(seed, length))

    async def _fitted_text(self, token_ids: list[int]) -> str | None:
        """Text the server tokenizes to ``len(token_ids)`` tokens, or None without /detokenize.

        Decoded ids need not tokenize back to as many: pieces merge differently where they
        join (510 to 550 tokens for 512 drawn, on the tiny model's tokenizer). So the server's
        own tokenization of the text is cut to length (or topped up from the drawn ids) and
        decoded again (one pass brought all of 16 such prompts to 512), until it holds or
        FIT_PASSES run out; usage reports the length either way.
        """
        n, url, model = len(token_ids), self.config.url, self.model
        text = await detokenize(self.client, url, model, token_ids)
        for _ in range(FIT_PASSES):
            got = None if text is None else await tokenize(self.client, url, model, text)
            if got is None or len(got) == n:
                break
            text = await detokenize(
                self.client, url, model, got[:n] if len(got) > n else got + token_ids[len(got) :]
            )
        return text

    # --- prompt file ----------------------------------------------------------------------

    async def _measure(self, dataset: Dataset, needed: int) -> list[str]:
        """Measure rows in the seeded order until ``needed`` fit (or the file ends)."""
        sent = self._sent
        order = list(range(len(dataset.rows)))
        random.Random(self.config.seed).shuffle(order)
        turns, out, limit = self.config.turns, self.config.output_tokens, self.max_model_len
        measured = too_long = 0
        rows: list[Conversation] = []
        while len(rows) < needed and measured < len(order):
            batch = order[measured : measured + max(_GATE, needed - len(rows))]
            measured += len(batch)
            convs = [
                Conversation(tuple(Prompt(t) for t in row.user_turns[:turns]), row.system)
                for row in (dataset.rows[i] for i in batch)
            ]
            counts = await asyncio.gather(*(self._count(conv) for conv in convs))
            for conv, count in zip(convs, counts):
                if (
                    count is not None
                    and limit is not None
                    and count + len(conv.turns) * out > limit
                ):
                    too_long += 1
                else:
                    rows.append(replace(conv, prompt_tokens=count))
        if not rows:
            raise SpecError(
                f"no row fits the model's max_model_len {self.max_model_len} with "
                f"{out} output tokens per turn (all {too_long} measured are too long)",
                file=dataset.file,
                field="prompt_file",
                hint="lower --output-tokens or --turns, or give shorter prompts",
            )
        self._rows = rows
        used = [rows[i % len(rows)] for i in range(sent)]
        self.summary = DatasetSummary(
            file=dataset.file,
            format=dataset.format,
            rows=len(dataset.rows),
            measured=measured,
            too_long=too_long,
            sent=sent,
            distinct=min(sent, len(rows)),
            prompt_tokens=LatencyStats.of(c.prompt_tokens for c in used),
        )
        warnings = []
        if too_long:
            warnings.append(
                f"{too_long} of {measured} rows measured in {dataset.file} would not fit "
                f"max_model_len {self.max_model_len} with their answers; they are left out"
            )
        if sent > len(rows):
            warnings.append(
                f"{dataset.file} has {len(rows)} rows that fit and the run sends {sent} "
                "conversations: rows repeat, and a repeat may be served from the prefix cache"
            )
        if any(c.prompt_tokens is None for c in rows):
            warnings.append("the server has no /tokenize: the prompt file's rows were not measured")
        return warnings

    async def _count(self, conversation: Conversation) -> int | None:
        """Tokens of the conversation's user side: its last turn, after the earlier turns
        with empty answers (one turn: exactly the prompt the server will count)."""
        last = len(conversation.turns) - 1
        history = tuple(Exchange(t.text, "") for t in conversation.turns[:last])
        async with self._gate:
            return await count_tokens(
                self.client,
                self.config.url,
                self.model,
                self.endpoint,
                conversation.prompt(last, history),
            )
