"""Answer extraction on a large table of response forms, traps included."""

from __future__ import annotations

import pytest

from tandem.eval import extract_answer
from tandem.eval.extract import extract_strict, split_reasoning

CASES = [
    # --- strict: the requested form
    ("strict plain", "Reasoning here.\nANSWER: B", "B", "strict"),
    ("strict lower marker word", "answer: D", "D", "strict"),
    ("strict title case", "Answer: A", "A", "strict"),
    ("strict no space", "ANSWER:C", "C", "strict"),
    ("strict with dollar", "ANSWER: $B$", "B", "strict"),
    ("strict trailing period", "ANSWER: C.", "C", "strict"),
    ("strict inside bold", "**ANSWER: A**", "A", "strict"),
    ("strict then explanation", "ANSWER: D because the spin is 1/2", "D", "strict"),
    ("strict final answer phrase", "Final Answer: B", "B", "strict"),
    ("strict tabs", "ANSWER:\tA", "A", "strict"),
    # --- several markers: last one wins
    (
        "two strict markers, last wins",
        "ANSWER: A\nWait, I made an error.\nANSWER: C",
        "C",
        "strict",
    ),
    ("three strict markers", "Answer: B ... Answer: D ... ANSWER: A", "A", "strict"),
    ("strict beats a later tolerant form", "ANSWER: B\n\\boxed{C}", "B", "strict"),
    ("strict beats a later bold form", "ANSWER: A\n**Answer:** D", "A", "strict"),
    # --- tolerant marked forms
    ("bold marker", "**Answer:** B", "B", "marked"),
    ("bold marker and letter", "**Answer:** **C**", "C", "marked"),
    ("parenthesised letter", "Answer: (B)", "B", "marked"),
    ("bracketed letter", "ANSWER: [D]", "D", "marked"),
    ("parenthesised lowercase", "Answer: (c)", "C", "marked"),
    ("lowercase alone on the line", "answer: c", "C", "marked"),
    ("lowercase with period", "Final answer: a.", "A", "marked"),
    ("the answer is", "Therefore the answer is C.", "C", "marked"),
    ("the correct answer is (A)", "So the correct answer is (A).", "A", "marked"),
    ("answer is bold", "The answer is **D**", "D", "marked"),
    ("letter on the next line", "ANSWER:\nB", "B", "marked"),
    ("letter two lines down", "**Answer:**\n\n(C)", "C", "marked"),
    ("italic marker", "*Answer*: B", "B", "marked"),
    ("text macro", "Answer: \\text{B}", "B", "marked"),
    ("two tolerant markers, last wins", "Answer: (A) hmm no. Answer: (D)", "D", "marked"),
    # --- boxed
    ("boxed", "$\\boxed{C}$", "C", "boxed"),
    ("boxed with text", "\\boxed{\\text{B}}", "B", "boxed"),
    ("boxed with textbf", "\\boxed{\\textbf{A}}", "A", "boxed"),
    ("boxed with parens", "\\boxed{(D)}", "D", "boxed"),
    ("boxed lowercase", "\\boxed{b}", "B", "boxed"),
    ("two boxes, last wins", "\\boxed{A} then \\boxed{B}", "B", "boxed"),
    # --- traps: never accepted
    ("answer: Because", "Answer: Because the field is uniform, it doubles.", None, "none"),
    ("answer: Consider", "ANSWER: Consider the limit first", None, "none"),
    ("answer: a reaction (article)", "Answer: a reaction that releases heat", None, "none"),
    ("answer: A word", "Answer: All of them are wrong", None, "none"),
    ("bare letter in prose", "I think B is the right one.", None, "none"),
    ("bare letter alone", "B", None, "none"),
    ("option line in prose", "B) 10^-8 eV looks right", None, "none"),
    ("letter only in reasoning", "<think>ANSWER: B</think>I am not sure.", None, "none"),
    ("letter only in unclosed reasoning", "<think>so ANSWER: C is likely and", None, "none"),
    ("letter before lone close tag", "ANSWER: D</think>Hmm.", None, "none"),
    ("ambiguous or", "ANSWER: B or C", None, "none"),
    ("ambiguous comma", "Answer: A, C", None, "none"),
    ("ambiguous slash", "Answer: (B)/(D)", None, "none"),
    ("boxed expression", "\\boxed{\\Delta E}", None, "none"),
    ("boxed number", "\\boxed{42}", None, "none"),
    ("letter E is not an option", "ANSWER: E", None, "none"),
    ("empty", "", None, "none"),
    ("no answer at all", "The energy is 10 eV and the wavelength 3 nm.", None, "none"),
    ("word answer without colon", "My answer B", None, "none"),
    # --- reasoning stripped, answer after it
    ("answer after think block", "<think>maybe ANSWER: A</think>\nANSWER: C", "C", "strict"),
    ("answer after lone close tag", "thinking... ANSWER: A</think>ANSWER: D", "D", "strict"),
    ("ambiguous skipped, earlier clear marker kept", "ANSWER: A\nANSWER: B or C", "A", "strict"),
]


@pytest.mark.parametrize(
    ("text", "letter", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_extract_answer(text: str, letter: str | None, rule: str) -> None:
    assert extract_answer(text) == (letter, rule)


def test_extract_answer_of_none() -> None:
    assert extract_answer(None) == (None, "none")


def test_extract_strict_ignores_tolerant_forms() -> None:
    assert extract_strict("**Answer:** B") is None
    assert extract_strict("x\nANSWER: C") == "C"


@pytest.mark.parametrize(
    ("text", "reasoning", "answer"),
    [
        ("<think>a</think>b", "a", "b"),
        ("a</think>b", "a", "b"),
        ("<think>a", "a", ""),
        ("plain", "", "plain"),
        ("<think>a</think>b<think>c</think>d", "a\nc", "bd"),
    ],
    ids=["block", "lone close", "unclosed", "none", "two blocks"],
)
def test_split_reasoning(text: str, reasoning: str, answer: str) -> None:
    assert split_reasoning(text) == (reasoning, answer)
