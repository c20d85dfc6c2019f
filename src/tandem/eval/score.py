"""Scoring one logged sample from its saved texts (so ``rescore`` and a live run agree).

The final answer is the main response's extraction when it has one; otherwise the fallback
re-ask's (its rule prefixed ``fallback-``); otherwise none (unparsed, scored wrong).
``strict`` scoring counts only the strict rule on the main response.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tandem.eval.client import ChatResponse
from tandem.eval.extract import RULE_NONE, extract_answer, extract_strict
from tandem.eval.log import SampleRecord
from tandem.eval.stats import Accuracy, clustered_accuracy, group_scores

FALLBACK_PREFIX = "fallback-"


@dataclass(frozen=True)
class ScoredSample:
    record_id: str
    repeat: int
    domain: str
    subdomain: str
    correct_letter: str
    letter: str | None
    rule: str
    correct: bool
    strict_correct: bool
    truncated: bool
    """The main response hit ``max_tokens`` (finish_reason ``length``)."""
    reasked: bool
    """The main response gave no answer, so the question was asked again (the re-ask)."""
    fallback_used: bool
    """The answer came from the re-ask."""
    error: str | None
    completion_tokens: int
    """Main response plus re-ask."""
    latency_s: float


def accuracy_of(scored: Iterable[ScoredSample], *, strict: bool = False) -> Accuracy:
    """Lenient (or ``strict``) pass@1 of scored samples, clustered by question."""
    pairs = ((s.record_id, float(s.strict_correct if strict else s.correct)) for s in scored)
    return clustered_accuracy(group_scores(pairs))


def extract_response(response: ChatResponse) -> tuple[str | None, str]:
    """The answer of a response (live, or saved and read again) from its raw text."""
    if response.error:
        return None, RULE_NONE
    text = response.raw_content if response.raw_content is not None else response.content
    return extract_answer(text)


def score_sample(record: SampleRecord) -> ScoredSample:
    """The outcome of one sample, recomputed from the saved response texts."""
    letter, rule = extract_response(record.response)
    fallback_used = False
    if letter is None and record.fallback is not None:
        fb_letter, fb_rule = extract_response(record.fallback)
        if fb_letter is not None:
            letter, rule, fallback_used = fb_letter, FALLBACK_PREFIX + fb_rule, True
    main = record.response
    strict_letter = (
        None
        if main.error
        else extract_strict(main.raw_content if main.raw_content is not None else main.content)
    )
    tokens = (main.completion_tokens or 0) + (
        (record.fallback.completion_tokens or 0) if record.fallback else 0
    )
    latency = main.latency_s + (record.fallback.latency_s if record.fallback else 0.0)
    return ScoredSample(
        record_id=record.record_id,
        repeat=record.repeat,
        domain=record.domain,
        subdomain=record.subdomain,
        correct_letter=record.correct_letter,
        letter=letter,
        rule=rule,
        correct=letter == record.correct_letter,
        strict_correct=strict_letter == record.correct_letter,
        truncated=main.finish_reason == "length",
        reasked=record.fallback is not None,
        fallback_used=fallback_used,
        error=main.error or (record.fallback.error if record.fallback else None),
        completion_tokens=tokens,
        latency_s=latency,
    )
