"""Answer extraction in layers, each answer naming the rule that found it.

``extract_answer(text)`` first removes reasoning (``<think>…</think>`` blocks, an unclosed
``<think>`` to the end, or everything before a lone ``</think>``): a letter that appears only in
the reasoning never counts. Then, on the answer text:

1. ``strict``  — the requested form ``ANSWER: X``: the word *answer* (any case), optional spaces,
   a colon, optional spaces, an upper-case letter A-D standing alone (``$X$`` and a trailing
   ``.`` are allowed). simple-evals' regex, made safe: the letter must be upper case and end a
   word, so ``Answer: Because…`` is not B.
2. ``marked``  — tolerant forms anchored to an answer marker: ``**Answer:** B``, ``**Answer: B**``,
   ``Answer: (B)``, ``Answer: [B]``, ``Final answer: b``, ``The answer is (C)``, the letter alone
   on the line after ``Answer:``. A lower-case letter counts only where it cannot be an English
   word: inside brackets, or alone up to the end of the line (``answer: c``); never in
   ``Answer: a reaction…``.
3. ``boxed``   — ``\\boxed{B}``, ``\\boxed{\\text{B}}``, ``\\boxed{(B)}``: exactly one letter in the
   box (``\\boxed{\\Delta E}`` is not E).

Never: a bare letter in prose (``I think B is right``), which is how letter-anywhere fallbacks
"decide" most questions by accident.

Several markers: within the first layer that matches, the **last** match wins (a model that
corrects itself ends with its final choice). A marker naming two letters (``ANSWER: B or C``,
``Answer: A, C``) is ambiguous and skipped. If no layer matches the result is
``(None, "none")``; the harness then re-asks (see ``prompt.fallback_messages``) and records the
re-ask's rule as ``fallback-<rule>``.
"""

from __future__ import annotations

import re

RULE_STRICT = "strict"
RULE_MARKED = "marked"
RULE_BOXED = "boxed"
RULE_NONE = "none"

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)

# A second letter right after the first makes the marker ambiguous.
_AMBIGUOUS_TAIL = re.compile(r"\s*(?:,|/|&|\bor\b|\band\b)\s*[(\[]?[A-Da-d](?![A-Za-z0-9])")

_STRICT = re.compile(r"(?i:answer)[ \t]*:[ \t]*\$?(?P<letter>[A-D])\$?(?![A-Za-z0-9])")

_MARKER = r"(?i:(?:final|correct)\s+)?(?i:answer)"
_MARKED = [
    # **Answer:** B / *Answer*: B / __Answer__: (B) / Answer: **B** / Answer - [B]
    re.compile(
        _MARKER + r"[ \t]*(?:\*\*|__|\*|_)?[ \t]*[:\-–][ \t]*(?:\*\*|__|\*|_)?[ \t]*"
        r"(?:\$|\\text\{)?[(\[](?P<letter>[A-Da-d])[)\]]"
    ),
    re.compile(
        _MARKER + r"[ \t]*(?:\*\*|__|\*|_)?[ \t]*[:\-–](?:[ \t]|\*\*|__|\*|_)*"
        r"(?:\\text\{)?(?P<letter>[A-D])\}?(?:\*\*|__|\*|_)?(?![A-Za-z0-9])"
    ),
    # the answer is (C) / the correct answer is C / answer is **D**
    re.compile(
        _MARKER + r"\s+(?i:is)\s*:?\s*(?:\*\*)?[(\[]?(?P<letter>[A-D])[)\]]?(?:\*\*)?"
        r"(?![A-Za-z0-9])"
    ),
    # answer: c   (a lower-case letter alone to the end of the line)
    re.compile(
        _MARKER + r"[ \t]*(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?[ \t]*(?P<letter>[a-d])[.)]?"
        r"[ \t]*(?:\*\*)?[ \t]*$",
        re.MULTILINE,
    ),
    # Answer:\n\nB   (the letter alone on the next non-empty line)
    re.compile(
        _MARKER + r"[ \t]*(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?[ \t]*\n\s*(?:\*\*)?[(\[]?"
        r"(?P<letter>[A-Da-d])[)\]]?\.?(?:\*\*)?[ \t]*$",
        re.MULTILINE,
    ),
]

_BOXED = re.compile(
    r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?[(\[]?(?P<letter>[A-Da-d])[)\]]?\s*\}?"
    r"\s*\}"
)


def split_reasoning(text: str) -> tuple[str, str]:
    """Split model text into ``(reasoning, answer)`` at its ``<think>`` tags.

    ``<think>…</think>`` blocks (an unclosed one runs to the end) are reasoning; so is everything
    before a ``</think>`` that has no opening tag (templates that open the block in the prompt).
    """
    reasoning_parts: list[str] = []
    if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
        head, text = text.split("</think>", 1)
        reasoning_parts.append(head)

    def keep(match: re.Match[str]) -> str:
        reasoning_parts.append(match.group(0).removeprefix("<think>").removesuffix("</think>"))
        return ""

    answer = _THINK_BLOCK.sub(keep, text)
    return "\n".join(p.strip() for p in reasoning_parts if p.strip()), answer.strip()


def _last_unambiguous(patterns: list[re.Pattern[str]], text: str) -> str | None:
    found: list[tuple[int, str]] = []
    for pattern in patterns:
        for match in pattern.finditer(text):
            if _AMBIGUOUS_TAIL.match(text, match.end()):
                continue
            found.append((match.start("letter"), match.group("letter").upper()))
    return max(found)[1] if found else None


_LAYERS = [(RULE_STRICT, [_STRICT]), (RULE_MARKED, _MARKED), (RULE_BOXED, [_BOXED])]


def extract_answer(text: str | None) -> tuple[str | None, str]:
    """The answer letter of a response and the rule that found it.

    Usage:
        extract_answer("...so the energy doubles.\\nANSWER: C")   # ("C", "strict")
        extract_answer("**Answer:** B")                            # ("B", "marked")
        extract_answer("I think B is right")                       # (None, "none")

    Returns:
        ``(letter, rule)``: an upper-case letter A-D and one of ``strict``, ``marked``, ``boxed``;
        or ``(None, "none")``.
    """
    if not text:
        return None, RULE_NONE
    _, answer = split_reasoning(text)
    for rule, patterns in _LAYERS:
        letter = _last_unambiguous(patterns, answer)
        if letter is not None:
            return letter, rule
    return None, RULE_NONE


def extract_strict(text: str | None) -> str | None:
    """Only the strict layer: the letter of the last ``ANSWER: X``, or None."""
    if not text:
        return None
    return _last_unambiguous([_STRICT], split_reasoning(text)[1])
