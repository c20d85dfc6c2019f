"""The one exception tree of tandem.

    TandemError                  anything tandem reports to a user as a message, never a traceback
    ├── SpecError                what the user gave us is wrong (a file, a field, a flag)
    │   ├── RecipeError          a recipe file or built-in name
    │   └── ClusterError         a cluster inventory
    ├── PlanError                the recipe and cluster are each valid but cannot work together
    ├── BackendError             the world did something while we launched or stopped ranks
    │   ├── RankFailed           a rank exited or never became ready
    │   ├── SSHError             a node could not be reached, refused our key, lacks a command
    │   ├── StateError           no deployment of that name, or its state file is unreadable
    │   ├── NotOwned             a destructive step aimed outside what tandem owns (refused)
    │   └── KubernetesError      kubectl or the API server refused or failed a request
    ├── EndpointError            an OpenAI-compatible endpoint refused or broke a request
    │   └── Unauthorized         it wants an API key we did not send, or another one
    └── CheckFailed              preflight found at least one error

A caller that wants every user-facing failure writes ``except TandemError``; a programming
mistake (``TypeError``, ``KeyError``...) is never caught by that, and keeps its traceback.

Every error carries a stable kebab-case ``code``, a ``message``, and where known the ``file``,
the dotted ``field`` path, the ``hint`` that says how to fix it, and the ``rank`` or ``node``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Problem:
    """One thing wrong with an input: where it is and how to fix it."""

    field: str
    message: str
    hint: str | None = None
    file: str | None = None
    """The file the field is in, when one report spans several files (recipe, cluster)."""

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.file:
            text = f"{self.file}: {text}"
        return f"{text} (fix: {self.hint})" if self.hint else text


class TandemError(Exception):
    """Base of every error shown to a user as a message.

    Usage:
        try:
            run(...)
        except TandemError as exc:
            print(exc)        # one message naming file, field and fix
    """

    code = "tandem-error"

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        hint: str | None = None,
        node: str | None = None,
        rank: int | None = None,
        problems: list[Problem] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.field = field
        self.hint = hint
        self.node = node
        self.rank = rank
        self.problems = problems or []

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(self.file)
        if self.node:
            where.append(f"node {self.node}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.field:
            where.append(self.field)
        head = f"{': '.join(where)}: {self.message}" if where else self.message
        lines = [head]
        lines += [
            f"  - {replace(p, file=None) if p.file == self.file else p}" for p in self.problems
        ]
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)


class SpecError(TandemError):
    """A file, field or flag the user gave is invalid. ``problems`` lists every one found."""

    code = "spec-invalid"


class RecipeError(SpecError):
    code = "recipe-invalid"


class ClusterError(SpecError):
    code = "cluster-invalid"


class PlanError(TandemError):
    """Recipe and cluster are valid alone but the deployment is impossible."""

    code = "plan-impossible"


class BackendError(TandemError):
    """Launching, watching or stopping ranks failed."""

    code = "backend-failed"


class RankFailed(BackendError):
    """A rank exited early or the deployment did not become ready in time."""

    code = "rank-failed"


class SSHError(BackendError):
    """A command over SSH failed before it could run: ``reason`` says which way.

    - ``unreachable``: no connection (refused, no route, DNS, timeout);
    - ``key-refused``: the host answered but did not accept any of our keys;
    - ``command-missing``: the remote shell could not find a program (exit status 127).

    Usage:
        try:
            transport.run(target, "vllm --version")
        except SSHError as exc:
            if exc.reason == SSHError.KEY_REFUSED: ...
    """

    code = "ssh-failed"
    UNREACHABLE = "unreachable"
    KEY_REFUSED = "key-refused"
    COMMAND_MISSING = "command-missing"

    def __init__(self, message: str, *, reason: str, **context) -> None:
        super().__init__(message, **context)
        self.reason = reason


class StateError(BackendError):
    """A deployment's state cannot be found or read."""

    code = "state-missing"


class NotOwned(BackendError):
    """A delete, overwrite or kill aimed at something tandem does not own; nothing was done
    (``tandem.ownership``)."""

    code = "not-owned"


class KubernetesError(BackendError):
    """kubectl or the API server refused a request; the message carries the server's words."""

    code = "kubernetes-failed"


class EndpointError(TandemError):
    """An endpoint refused or broke a request."""

    code = "endpoint-failed"


class Unauthorized(EndpointError):
    """The server answered 401: it was started with an API key and ours is missing or wrong.

    Usage:
        if response.status_code == 401:
            raise Unauthorized(url)
    """

    code = "endpoint-unauthorized"

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url} answered 401 Unauthorized: the server requires an API key",
            hint="pass --api-key or set VLLM_API_KEY to the key the server was started with",
        )


class CheckFailed(TandemError):
    """Preflight found at least one error-severity finding."""

    code = "check-failed"


class FieldFault(ValueError):
    """Raised by a model's validator: what is wrong with one field, and the fix apart.

    Not a ``TandemError``: pydantic collects it, and the loader turns each into a ``Problem``
    whose ``hint`` is this ``hint``.

    Usage:
        raise FieldFault(f"'{value}' is not an IP address", hint="write e.g. 10.0.0.1")
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass
class ProblemList:
    """Collects problems during validation, so all of them are reported at once."""

    items: list[Problem] = field(default_factory=list)

    def add(self, field_path: str, message: str, hint: str | None = None) -> None:
        self.items.append(Problem(field_path, message, hint))

    def __bool__(self) -> bool:
        return bool(self.items)
