"""A reference of a deployment's own answers, recorded when a revision is judged good.

The ``answers`` check (``tandem.eval.answers``) judges a server against one: the greedy
answers a good revision gave to a fixed prompt set, with each answer's token ids and
log-probabilities, and the noise the model itself showed while it was recorded, so that the
check's limits stand on a measurement of this model on this machine, not on a guess.

Algorithm of ``record_reference``:

1. Render each prompt with the server's chat template (``/tokenize``).
2. Generate each greedy answer, ``concurrency`` at a time (token ids, log-probabilities and
   each token's lead over its runner-up), and once more in the reverse order, so that every
   answer is computed in another batch: a prompt whose two answers differ is a greedy flip,
   and one that differs where the first answer led by ``NEAR_TIE`` or more is a sure flip.
3. Score each answer teacher-forced three times: in batches, again in batches of the reverse
   order, and alone (one request at a time). The first gives each answer's mean per-token
   log-likelihood; the others its run-to-run and batch-to-batch noise.
4. Score the known-answer questions against their ground truth.

A model whose greedy tokens are mostly near ties (random weights: every logit alike) has no
answers to hold another revision to: ``judgeable`` is false and the check says it cannot judge.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tandem import files
from tandem.eval.answer_client import AnswerClient, Generation
from tandem.eval.outcome import NEAR_TIE
from tandem.eval.prompt_sets import AnswerPrompt, PromptSet, matches
from tandem.jsonfiles import read_json
from tandem.ownership import RunKind
from tandem.redact import public_url

SCHEMA_VERSION = 1
REFERENCE_FILE = "answers-reference.json"
"""The reference's name in a folder (a revision's, or one given to ``--reference``)."""
RUN = RunKind(
    "eval reference",
    "an answers reference",
    resume_flag=None,
    is_own=lambda folder: (folder / REFERENCE_FILE).is_file(),
)
"""A reference's ``--out`` folder: recorded again when given again (a reference is one
sitting)."""
SURE_SHARE = 0.5
"""A reference is judgeable when at least this share of its answer tokens led their runner-up
by ``NEAR_TIE`` or more: its greedy answers are the model's choices, not ties broken by noise."""


class RecordedAnswer(BaseModel):
    """One prompt's greedy answer on the reference revision."""

    model_config = ConfigDict(extra="forbid")

    prompt: AnswerPrompt
    prompt_ids: list[int] = Field(description="The chat as the server's template rendered it.")
    text: str
    ids: list[int] = Field(description="The answer's token ids, the stop token included.")
    logprobs: list[float] = Field(description="Each token's log-probability as generated.")
    margins: list[float | None] = Field(description="Each token's lead over the runner-up.")
    finish_reason: str | None = None
    scored: list[float] = Field(description="Each token's log-probability, teacher-forced.")
    noise: float = Field(
        description="The largest change of the mean per-token log-likelihood between the "
        "three scorings (batched, batched again, alone), nats/token."
    )
    correct: bool | None = Field(
        default=None, description="Matches the ground truth (known-answer questions only)."
    )

    @property
    def mean_logprob(self) -> float:
        return mean(self.scored)


class ReferenceNoise(BaseModel):
    """What the reference revision itself moved by while it was recorded."""

    model_config = ConfigDict(extra="forbid")

    rescored: float = Field(
        description="|mean over prompts of the change of mean log-likelihood| between two "
        "batched scorings, nats/token."
    )
    alone: float = Field(description="The same between batched and one-at-a-time scoring.")
    prompt_max: float = Field(description="The largest per-prompt noise, nats/token.")
    token_max: float = Field(description="The largest change of one token's log-probability.")
    greedy_flips: int = Field(description="Prompts whose greedy answer differed between passes.")
    sure_flips: int = Field(description="Of those, flips where the first pass led by NEAR_TIE.")

    @property
    def mean(self) -> float:
        """The noise of the mean over prompts: the larger of the two scorings' changes."""
        return max(self.rescored, self.alone)


class Reference(BaseModel):
    """A good revision's answers to a versioned prompt set (``answers-reference.json``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    model: str
    url: str
    recorded_at: datetime
    prompt_sets: list[str] = Field(description="The sets asked, e.g. `prompts-1`, `known-1`.")
    digest: str = Field(description="sha256 of every prompt asked, 16 hex digits.")
    answers: list[RecordedAnswer]
    noise: ReferenceNoise
    sure_share: float = Field(
        description="Share of answer tokens that led their runner-up by NEAR_TIE or more."
    )
    seconds: float = Field(description="Wall time of the recording.")

    @property
    def judgeable(self) -> bool:
        return self.sure_share >= SURE_SHARE

    def known(self) -> list[RecordedAnswer]:
        """The answers to questions with a ground truth."""
        return [a for a in self.answers if a.prompt.answers]


def sure_share(margins: list[float | None]) -> float:
    """The share of tokens whose lead over the runner-up reached ``NEAR_TIE`` (0 for none)."""
    known = [m for m in margins if m is not None]
    return sum(m >= NEAR_TIE for m in known) / len(known) if known else 0.0


def first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    """The index where token lists ``a`` and ``b`` first differ (one ending early counts)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def mean(values: list[float]) -> float:
    """The mean of ``values``, 0 for none (an empty answer's mean log-likelihood)."""
    return statistics.fmean(values) if values else 0.0


def record_at(url: str, model: str, api_key: str | None, sets: list[PromptSet]) -> Reference:
    """``record_reference`` of the server at ``url`` on a client of its own, closed after.

    Raises:
        EndpointError: the server failed a request (nothing is recorded).
    """
    with AnswerClient(url, model, api_key=api_key) as client:
        return record_reference(client, sets)


def record_reference(client: AnswerClient, sets: list[PromptSet]) -> Reference:
    """The server's answers to every prompt of ``sets``, with the noise it showed.

    Usage:
        with_known = [builtin_prompts(), builtin_known()]
        reference = record_reference(AnswerClient(url, model, api_key=key), with_known)
        save_reference(reference, state_folder)

    Raises:
        EndpointError: the server failed a request (nothing is recorded).
    """
    started = time.monotonic()
    prompts = [p for s in sets for p in s.prompts]
    ids = client.map(lambda p: client.template(p.messages), prompts)
    tasks = list(zip(prompts, ids, strict=True))
    first = client.map(lambda t: client.generate(t[1], t[0].max_tokens), tasks)
    again = client.map(lambda t: client.generate(t[1], t[0].max_tokens), tasks[::-1])[::-1]
    pairs = [(i, g.ids) for i, g in zip(ids, first, strict=True)]
    scored = client.map(lambda p: client.score(*p), pairs)
    rescored = client.map(lambda p: client.score(*p), pairs[::-1])[::-1]
    alone = [client.score(*p) for p in pairs]
    answers = [
        _recorded(prompt, prompt_ids, generation, runs)
        for prompt, prompt_ids, generation, runs in zip(
            prompts, ids, first, zip(scored, rescored, alone, strict=True), strict=True
        )
    ]
    flips = [
        (a, at)
        for a, g in zip(answers, again, strict=True)
        if (at := first_difference(a.ids, g.ids)) is not None
    ]
    return Reference(
        model=client.model,
        url=public_url(client.url),
        recorded_at=datetime.now(UTC),
        prompt_sets=[s.label for s in sets],
        digest=PromptSet(name="all", version="", prompts=prompts).digest(),
        answers=answers,
        noise=_noise(scored, rescored, alone, answers, flips),
        sure_share=sure_share([m for a in answers for m in a.margins]),
        seconds=round(time.monotonic() - started, 2),
    )


def _recorded(
    prompt: AnswerPrompt,
    prompt_ids: list[int],
    generation: Generation,
    runs: tuple[list[float], list[float], list[float]],
) -> RecordedAnswer:
    means = [mean(run) for run in runs]
    return RecordedAnswer(
        prompt=prompt,
        prompt_ids=prompt_ids,
        **generation.model_dump(),
        scored=runs[0],
        noise=max(abs(m - means[0]) for m in means),
        correct=matches(generation.text, prompt.answers) if prompt.answers else None,
    )


def _noise(
    scored: list[list[float]],
    rescored: list[list[float]],
    alone: list[list[float]],
    answers: list[RecordedAnswer],
    flips: list[tuple[RecordedAnswer, int]],
) -> ReferenceNoise:
    def shift(other: list[list[float]]) -> float:
        return abs(mean([mean(b) - mean(a) for a, b in zip(scored, other, strict=True)]))

    tokens = [
        abs(x - y)
        for other in (rescored, alone)
        for a, b in zip(scored, other, strict=True)
        for x, y in zip(a, b, strict=True)
    ]
    sure = [a for a, at in flips if at < len(a.margins) and (a.margins[at] or 0.0) >= NEAR_TIE]
    return ReferenceNoise(
        rescored=shift(rescored),
        alone=shift(alone),
        prompt_max=max((a.noise for a in answers), default=0.0),
        token_max=max(tokens, default=0.0),
        greedy_flips=len(flips),
        sure_flips=len(sure),
    )


def reference_path(path: Path) -> Path:
    """``path`` itself, or the reference file inside it when it is a folder."""
    return path / REFERENCE_FILE if path.is_dir() else path


def save_reference(reference: Reference, path: Path) -> Path:
    """Write ``reference`` to ``path`` (a folder gets ``answers-reference.json``); the path."""
    target = reference_path(path)
    files.write_json(target, reference)
    return target


def load_reference(path: Path) -> Reference:
    """The reference in ``path`` (a file, or a folder holding ``answers-reference.json``).

    Raises:
        SpecError: missing, unreadable, or not a reference.
    """
    return read_json(
        reference_path(path),
        Reference,
        what="reference of answers",
        hint="record one with `tandem eval answers record`, or pass the folder holding "
        f"{REFERENCE_FILE}",
    )
