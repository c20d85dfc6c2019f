"""Words of a command as a node's shell must read them: quoted, with ``~`` left to the node.

A path from a recipe or an inventory (``~/.cache/huggingface``, the default Hugging Face home)
means the home of whoever runs the command on the node, which this machine cannot know. Quoted
whole, the ``~`` reaches the program as a literal character: docker then takes
``~/.cache/huggingface:/cache/huggingface`` for the name of a volume and refuses it. So a word
that starts with ``~/`` (or is ``~``) is written ``"$HOME"/rest``, the rest quoted as usual:
the node's shell expands it, and the program gets an absolute path. Any other word is quoted
with ``shlex.quote``. The rendered text and what ``tandem up`` runs are made by the same
function, so they cannot differ.

Pure: text only.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def quote(word: str) -> str:
    """One shell word, with a leading ``~/`` kept for the node's shell to expand.

    Usage::

        quote("~/.cache/huggingface:/cache/huggingface")
        # '"$HOME"/.cache/huggingface:/cache/huggingface'
        quote("size=1g; rm")   # "'size=1g; rm'"
    """
    if word == "~":
        return '"$HOME"'
    if word.startswith("~/"):
        rest = word[2:]
        return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(word)


def join(argv: Iterable[str]) -> str:
    """A whole command as one line, each word through ``quote``."""
    return " ".join(quote(word) for word in argv)
