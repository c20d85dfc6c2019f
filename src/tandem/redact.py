"""Keeping secrets out of logs, rendered commands and support bundles.

A variable is secret when its name says so (``HF_TOKEN``, ``VLLM_API_KEY``, ``*_SECRET``,
``*_PASSWORD``); a flag is secret when it carries a key (``--api-key``). Secret values are
replaced by ``REDACTED``; everything else is kept, because a support bundle without the real
environment is useless.
"""

from __future__ import annotations

import re

REDACTED = "REDACTED"
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)",
                          re.IGNORECASE)
_SECRET_FLAGS = ("--api-key", "--hf-token")


def is_secret(name: str) -> bool:
    """True for a variable or flag name that holds a credential, e.g. ``HF_TOKEN``."""
    return bool(_SECRET_NAME.search(name)) or name.split("=", 1)[0] in _SECRET_FLAGS


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` with every secret value replaced."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of ``argv`` with the values of secret flags replaced (``--api-key X``, ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in _SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif "=" in arg and arg.split("=", 1)[0] in _SECRET_FLAGS:
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out
