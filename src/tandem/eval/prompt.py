"""The prompts: the simple-evals multiple-choice template and the fallback re-ask.

The question prompt is openai/simple-evals' ``QUERY_TEMPLATE_MULTICHOICE`` with the answer line
written ``ANSWER: $LETTER`` (OpenCompass' ``gpqa_openai_simple_evals`` variant, and the form the
seed's harness parses). One user message, no system message (DeepSeek's recommendation).

The fallback re-ask is for a response that gave no parsable answer (usually because it hit the
token budget while thinking): the question again, the tail of what the model wrote as its own
turn, and a short user turn asking only for the final line. It is sent with thinking off and a
small token budget.
"""

from __future__ import annotations

from tandem.eval.dataset import LETTERS, Sample

QUERY_TEMPLATE = (
    "Answer the following multiple choice question. The last line of your response should be of "
    "the following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of ABCD. "
    "Think step by step before answering.\n\n{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}"
)

FALLBACK_INSTRUCTION = (
    "Stop thinking now. Based on your work so far, give your final answer. Reply with exactly one "
    "line of the form 'ANSWER: $LETTER' (without quotes) where LETTER is one of ABCD."
)


def question_prompt(sample: Sample, template: str = QUERY_TEMPLATE) -> str:
    """The user message for one sample, options in the sample's order."""
    shown = dict(zip(LETTERS, sample.shown_options))
    return template.format(question=sample.question.question, **shown)


def fallback_messages(prompt: str, previous_text: str, *, context_chars: int) -> list[dict]:
    """Messages of the re-ask: the question, the tail of the model's own text, the instruction.

    ``previous_text`` is what the model wrote (reasoning and answer); only its last
    ``context_chars`` characters are sent back, so the re-ask fits the context window.
    """
    messages: list[dict] = [{"role": "user", "content": prompt}]
    tail = previous_text[-context_chars:].strip() if context_chars > 0 else ""
    if tail:
        messages.append({"role": "assistant", "content": tail})
    messages.append({"role": "user", "content": FALLBACK_INSTRUCTION})
    return messages
