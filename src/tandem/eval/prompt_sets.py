"""The prompts the ``answers`` check asks: the shipped, versioned sets and a user's own file.

Two sets ship with tandem as package data (``tandem/data/answers``):

- ``prompts-N.json``: a few dozen short prompts across facts, arithmetic, instruction
  following, code, several languages, conversations whose answer needs the system message or
  an earlier turn (what a template that drops part of a conversation loses), and one long-ish
  context;
- ``known-N.json``: questions with a ground truth, scored by ``matches``.

Each file carries its ``version``; any change to a prompt makes a new version (a new file), so
a reference recorded with one version is only ever judged against the same prompts, and
``PromptSet.digest`` tells a hand-edited copy apart.

A user's prompts file is JSON Lines, one prompt a line::

    {"id": "refund", "prompt": "How do I ask for a refund?"}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "max_tokens": 64, "answers": ["42"]}

``prompt`` (a user message) or ``messages``; ``id`` defaults to ``user-LINE``; ``answers``
makes it a known-answer question too.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.jsonfiles import read_jsonl

PROMPTS_VERSION = "1"
"""The shipped prompt set a new reference is recorded with (``prompts-1.json``)."""
KNOWN_VERSION = "1"
"""The shipped known-answer set (``known-1.json``)."""
DEFAULT_MAX_TOKENS = 48


class AnswerPrompt(BaseModel):
    """One prompt: a chat, how long its answer may be, and its ground truth if it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Unique in its set, e.g. `fact-germany`.")
    kind: str = Field(default="user", description="What it tests: fact, code, known, ...")
    messages: list[dict[str, str]] = Field(
        min_length=1, description="The chat, OpenAI style: `role` and `content`."
    )
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=1024)
    answers: list[str] = Field(
        default_factory=list,
        description="Accepted answers (a known-answer question); empty: no ground truth.",
    )


class PromptSet(BaseModel):
    """A versioned list of prompts, ids unique."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="`prompts`, `known`, or `user` for a user's file.")
    version: str = Field(description="The shipped file's version; a user file's digest.")
    description: str = ""
    prompts: list[AnswerPrompt]

    @property
    def label(self) -> str:
        """``name-version``, as a reference lists the sets it asked (``prompts-1``)."""
        return f"{self.name}-{self.version}"

    @model_validator(mode="after")
    def _ids_unique(self) -> PromptSet:
        twice = [name for name, n in Counter(p.id for p in self.prompts).items() if n > 1]
        if twice:
            raise ValueError(f"prompt ids appear twice: {', '.join(sorted(set(twice)))}")
        return self

    def digest(self) -> str:
        """sha256 of the prompts as sent (ids, chats, lengths, answers), 16 hex digits."""
        text = json.dumps([p.model_dump() for p in self.prompts], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shipped(name: str) -> PromptSet:
    text = (resources.files("tandem") / "data" / "answers" / name).read_text(encoding="utf-8")
    return PromptSet.model_validate_json(text)


def builtin_prompts(version: str = PROMPTS_VERSION) -> PromptSet:
    """The shipped prompt set of this version."""
    return _shipped(f"prompts-{version}.json")


def builtin_known(version: str = KNOWN_VERSION) -> PromptSet:
    """The shipped known-answer set of this version (every prompt has ``answers``)."""
    return _shipped(f"known-{version}.json")


def reference_sets(user_file: Path | None = None) -> list[PromptSet]:
    """What a reference asks: the shipped prompt and known-answer sets, and the user's file."""
    return [builtin_prompts(), builtin_known(), *([user_prompts(user_file)] if user_file else [])]


class _UserRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=1024)
    answers: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_of(self) -> _UserRow:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give `prompt` (a user message) or `messages`, one of the two")
        return self


def user_prompts(path: Path) -> PromptSet:
    """A user's prompts file (JSON Lines, see the module); its version is its content's digest.

    Raises:
        SpecError: unreadable, a line that is not a prompt, or ids that repeat.
    """
    rows = read_jsonl(
        path,
        _UserRow.model_validate,
        what="prompt",
        hint='one JSON object a line: {"prompt": "..."} or {"messages": [...]}',
    ).records
    prompts = [
        AnswerPrompt(
            id=row.id or f"user-{line}",
            kind="user",
            messages=row.messages or [{"role": "user", "content": row.prompt or ""}],
            max_tokens=row.max_tokens,
            answers=row.answers,
        )
        for line, row in enumerate(rows, start=1)
    ]
    found = PromptSet(name="user", version="", description=f"from {path.name}", prompts=prompts)
    return found.model_copy(update={"version": found.digest()})


def words(text: str) -> list[str]:
    """``text`` as lower-case words, accents and punctuation aside (``Paris!`` -> ``paris``)."""
    plain = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in plain if not unicodedata.combining(c)).lower()
    return re.findall(r"\w+", plain)


def matches(text: str, answers: list[str]) -> bool:
    """Whether ``text`` holds one of ``answers`` as whole words, in order (``The capital is
    Paris.`` matches ``Paris``; ``Parisian`` does not)."""
    said = words(text)
    for answer in answers:
        wanted = words(answer)
        n = len(wanted)
        if n and any(said[i : i + n] == wanted for i in range(len(said) - n + 1)):
            return True
    return False
