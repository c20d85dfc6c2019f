"""Keeping secrets out of logs, rendered commands, state files and support bundles.

This is the one redaction path of tandem: every text or structure that leaves the process
goes through it: every line printed, which ``tandem.screen`` passes through it, and every file
written, which ``tandem.files`` passes through it (``state.json``, watch samples, bench and eval
results, log copies, ``logs --bundle``).

A secret is recognised three ways:

- by **name**: a variable or key whose name has a part ``TOKEN``, ``KEY``, ``SECRET``,
  ``PASSWORD`` or ``PASSWD`` (``HF_TOKEN``, ``VLLM_API_KEY``, ``AWS_SECRET_ACCESS_KEY``), but not
  ``TOKENIZERS_PARALLELISM``; a flag whose last word is one (``--api-key``, ``--hf-token``,
  ``--token``, ``--client-secret``, ``--password``), but not ``--token-ids``;
- by **value**: text shaped like a credential (``hf_...``, ``sk-...``, ``Bearer ...``), and,
  inside any text, a secret flag's value (``--token=X``, ``--token X``), a secret name's
  assignment in a command (``env HF_TOKEN=X vllm serve``) and the password of a URL
  (``http://user:X@host``; a userinfo that is a token alone, ``https://X@host``, too);
- by **the caller's values**: whatever the caller's own environment holds under a secret name
  (its ``VLLM_API_KEY``, ``HF_TOKEN``) or gave on the command line (``--api-key``,
  ``remember_secret``), wherever that value shows up in a text, e.g. in a rank's log or a
  server's error body.

Secret values are replaced by ``REDACTED``; everything else is kept, because a support bundle
without the real environment is useless.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REDACTED = "REDACTED"
_SECRET_PARTS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"}
_SECRET_WORD = r"(?:token|key|secret|password|passwd|apikey|credentials)"
"""A part of a name that makes it secret, as a pattern (matched case-insensitively)."""
_SECRET_SUFFIXES = ("TOKEN", "APIKEY", "SECRET", "PASSWORD", "PASSWD")
_REFERENCE_PARTS = {"PATH", "FILE", "DIR"}
"""A name ending in one of these holds where a secret is (``HF_TOKEN_PATH``), not the secret."""
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_\-]{16,})")
_WORD = r"(?!(?-i:[a-z]+)(?:[\s,;:!?)]|\.(?:\s|$)|$))"
"""Not a plain lower-case word: ``--api-key or ...`` and ``Bearer token`` in prose stay."""
_BEARER = re.compile(r"(\bBearer\s+)" + _WORD + r"[A-Za-z0-9._~+/=\-]+", re.IGNORECASE)
_KEY_IN_TEXT = re.compile(
    r"((?:--(?:[a-z0-9]+[-_])*" + _SECRET_WORD + r"(?:=|\s+" + _WORD + r"))"
    r"|\b(?:api|hf)[-_](?:key|token)['\"]?\s*:\s*\[?\s*['\"]?"
    r"|\b(?:[a-z0-9]+_)*" + _SECRET_WORD + r"=)"
    r"(?![.$<])[^\s'\",;&\]\\]+",
    re.IGNORECASE,
)
"""``--api-key KEY``, ``--client-secret=KEY``, ``'api_key': 'KEY'`` (vLLM's "non-default
args"), ``HF_TOKEN=KEY`` in a command (a name ending in a secret word: not ``HF_TOKEN_PATH=``,
not ``stop_token_ids=``); a placeholder (``...``, ``$VAR``, ``<key>``) stays. The value ends
at a quote or a backslash, so JSON text stays JSON (``\\"`` keeps its backslash)."""
_URL_PASSWORD = re.compile(
    r"\b([a-z][a-z0-9+.-]*://[^\s/?#@:'\"<>]*:)(?![$<])[^\s/?#@'\"<>]+@", re.IGNORECASE
)
"""The password of a URL's userinfo (``http://user:PASS@host``); the user stays."""
_URL_TOKEN = re.compile(
    r"\b([a-z][a-z0-9+.-]*://)(?!(?-i:[a-z.-]{1,32})@)(?![$<])[^\s/?#@:'\"<>]+@",
    re.IGNORECASE,
)
"""A userinfo without a password that is not a plain lower-case user name
(``https://ghp_x1y2@host``): a token; ``ssh://git@host`` stays."""
MIN_SECRET_CHARS = 6
"""Shorter caller values are not scrubbed from texts: they would match ordinary words."""


def is_secret(name: str) -> bool:
    """True for a variable or flag name that holds a credential, e.g. ``HF_TOKEN``."""
    flag = name.split("=", 1)[0]
    upper = flag.upper()
    if flag.startswith("-"):
        return re.split(r"[-_]+", upper.strip("-"))[-1] in _SECRET_PARTS
    words = re.split(r"[^A-Z0-9]+", upper)
    if words[-1] in _REFERENCE_PARTS:
        return False
    parts = set(words)
    return bool(parts & _SECRET_PARTS) or upper.endswith(_SECRET_SUFFIXES)


def looks_like_secret_value(value: str) -> bool:
    """True for text shaped like a credential: a Hugging Face (``hf_``) or OpenAI-style
    (``sk-``) token, or a ``Bearer`` header."""
    return bool(_SECRET_VALUE.search(value) or re.search(r"\bBearer\s+\S", value, re.I))


_GIVEN: set[str] = set()
"""Secret values the caller gave this process other than in its environment (``--api-key``)."""


def remember_secret(value: str | None) -> str | None:
    """Count ``value`` among the caller's secrets from now on (a key given as ``--api-key``),
    so every redactor of this process hides it; returns it."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _GIVEN.add(value)
    return value


def forget_secrets() -> None:
    """Forget what ``remember_secret`` was told (a new command of a process that runs several,
    as the tests do)."""
    _GIVEN.clear()


def caller_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values the caller's environment holds under secret names (``VLLM_API_KEY``...),
    and those it gave on the command line (``remember_secret``)."""
    environ = os.environ if environ is None else environ
    named = [v for k, v in environ.items() if is_secret(k) and len(v) >= MIN_SECRET_CHARS]
    return named + sorted(_GIVEN)


class Redactor:
    """Replaces secrets in texts, environments, argv lists and JSON-like structures.

    Usage:
        redactor = Redactor.for_caller()          # also knows this process's secret values
        safe = redactor.text(log_text)
        safe_env = redactor.env(rank.env)

    Args:
        values: secret values to scrub wherever they appear (besides names and shapes).
    """

    def __init__(self, values: list[str] | None = None) -> None:
        self.values = sorted(
            {v for v in values or [] if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True
        )

    @classmethod
    def for_caller(cls, extra: list[str] | None = None) -> Redactor:
        """A redactor that knows the caller's secret values, plus ``extra``."""
        return cls(caller_secrets() + list(extra or []))

    def text(self, text: str) -> str:
        """``text`` with known values, credential shapes, Bearer headers and key flags hidden."""
        for value in self.values:
            text = text.replace(value, REDACTED)
        text = _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text)
        text = _URL_TOKEN.sub(rf"\g<1>{REDACTED}@", text)
        text = _SECRET_VALUE.sub(REDACTED, text)
        text = _BEARER.sub(rf"\g<1>{REDACTED}", text)
        return _KEY_IN_TEXT.sub(rf"\g<1>{REDACTED}", text)

    def value(self, name: str, value: str) -> str:
        """One variable's value: hidden when its name or its value says it is secret."""
        if is_secret(name) or looks_like_secret_value(value):
            return REDACTED
        return self.text(value)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A copy of ``env`` with every secret value replaced."""
        return {k: self.value(k, v) for k, v in env.items()}

    def argv(self, argv: list[str]) -> list[str]:
        """A copy of ``argv`` with secret flags' values replaced (``--api-key X``, ``=X``)."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            flag = arg.startswith("--") and is_secret(arg)
            if hide_next and not arg.startswith("--"):  # `--token --next-flag`: no value
                out.append(REDACTED)
            elif flag and "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg if flag else self.text(arg))
            hide_next = flag and "=" not in arg
        return out

    def data(self, data: object, *, names: bool = True) -> object:
        """A JSON-like structure with secret-looking strings hidden, and with ``names`` the
        string values of secret keys too (an ``env`` of the user's). A record whose keys are
        tandem's own (an eval sample's ``key`` is a hash) is redacted with ``names=False``."""
        if isinstance(data, dict):
            return {
                k: (
                    REDACTED
                    if names and isinstance(k, str) and is_secret(k) and isinstance(v, str)
                    else self.data(v, names=names)
                )
                for k, v in data.items()
            }
        if isinstance(data, list):
            return (
                self.argv(data)
                if all(isinstance(v, str) for v in data)
                else [self.data(v, names=names) for v in data]
            )
        if isinstance(data, str):
            return self.text(data)
        return data


def public_url(url: str) -> str:
    """``url`` as tandem may show and store it: the password of its userinfo (and the caller's
    secret values) hidden. The request still goes to the URL as given."""
    return Redactor.for_caller().text(url)


def redact_text(text: str) -> str:
    """``text`` with every secret tandem can recognise replaced (the caller's included)."""
    return Redactor.for_caller().text(text)
