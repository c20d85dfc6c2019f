"""The words every quick check of a running server answers in: an outcome, its evidence, and the
near-tie rule that tells batch variance from garbling.

``tandem eval smoke`` runs its checks and the ``answers`` check (``tandem.eval.answers``) with
these; an upgrade's gate reads them. One home, so that a check and its reader never disagree on
what "cannot judge" or a near tie means.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

NEAR_TIE = 0.5
"""A greedy token led its runner-up by less than this (nats of log-probability): another batch
shape may flip it without anything being wrong. vLLM is not batch-invariant, and in bf16 a
logit of magnitude 10-30 carries a rounding error of 0.06-0.12, so two logits' difference may
move by 0.25 between batch shapes (seen: a flip at a lead of 0.125 on the real SmolLM2 in a
batch of 8). Garbled kernels flip tokens the model was sure of, nats apart."""


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not-applicable"
    CANNOT_JUDGE = "cannot-judge"
    INFO = "info"


class CheckResult(BaseModel):
    """One check's verdict and the evidence for it."""

    check: str
    outcome: Outcome
    summary: str
    evidence: list[str] = Field(default_factory=list)
    seconds: float = 0.0
