"""Renderers turn a RankPlan into text another program runs: shell commands, JSON, manifests.

Every renderer is ``render(plan, deployment, fmt) -> str`` and registered here by target name,
so ``tandem render --target NAME`` finds it; it is imported only when used.
"""

from __future__ import annotations

import importlib
import json
from typing import Protocol

from tandem.errors import SpecError
from tandem.rankplan import RankPlan
from tandem.redact import Redactor
from tandem.spec.deployment import Deployment


class Renderer(Protocol):
    def __call__(self, plan: RankPlan, deployment: Deployment, fmt: str) -> str: ...


# target -> "module:function"
TARGETS: dict[str, str] = {
    "process": "tandem.render.commands:render",
    "k8s": "tandem.render.kubernetes:render",
    "docker": "tandem.render.docker:render",
    "prometheus": "tandem.render.prometheus:render",
    "grafana": "tandem.render.grafana:render",
}
FORMATS: dict[str, tuple[str, ...]] = {
    "process": ("shell", "json"),
    "docker": ("shell", "json"),
    "k8s": ("yaml", "json"),
    "prometheus": ("yaml", "json"),
    "grafana": ("yaml", "json"),
}
"""The formats each target writes, its default first."""

# target -> "module:function" returning {file name: text}, for ``tandem render --out DIR``
FILE_TARGETS: dict[str, str] = {
    "prometheus": "tandem.render.prometheus:files",
    "grafana": "tandem.render.grafana:files",
}


def listing(texts: dict[str, str], fmt: str) -> str:
    """A files target on stdout: a JSON object of file -> text (``json``), else each file after
    a ``# ==> NAME <==`` line, as ``tail`` heads several files."""
    if fmt == "json":
        return json.dumps(texts, indent=2) + "\n"
    return "".join(f"# ==> {name} <==\n{text}\n" for name, text in texts.items())


class FileRenderer(Protocol):
    def __call__(self, plan: RankPlan, deployment: Deployment) -> dict[str, str]: ...


def files_renderer_for(target: str) -> FileRenderer:
    """The renderer of a target that writes several files into a folder."""
    if target not in FILE_TARGETS:
        raise SpecError(
            f"--target {target} prints to stdout; --out is for a target that writes several files",
            field="--out",
            hint=f"use --out with {', '.join(FILE_TARGETS)}",
        )
    module, _, function = FILE_TARGETS[target].partition(":")
    return getattr(importlib.import_module(module), function)


def check_format(target: str, fmt: str | None) -> str:
    """``fmt``, or the target's default when None.

    Raises:
        SpecError: an unknown target, or a format the target does not write.
    """
    if target not in TARGETS:
        raise SpecError(
            f"unknown render target '{target}'",
            field="--target",
            hint=f"use one of {', '.join(TARGETS)}",
        )
    formats = FORMATS[target]
    if fmt is not None and fmt not in formats:
        raise SpecError(
            f"the {target} target does not write {fmt}",
            field="--format",
            hint=f"use {' or '.join(formats)} with --target {target}",
        )
    return fmt or formats[0]


def renderer_for(target: str) -> Renderer:
    """The renderer of ``target``, wrapped so that its text goes through the one redaction path
    (``tandem.redact``: secret names, credential shapes and the caller's secret values).

    Raises:
        SpecError: an unknown target; the renderer raises it for a format the target does not
            write.
    """
    check_format(target, None)
    module, _, function = TARGETS[target].partition(":")
    renderer: Renderer = getattr(importlib.import_module(module), function)

    def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
        fmt = check_format(target, fmt)
        redactor = Redactor.for_caller()
        safe = plan.model_copy(
            update={
                "ranks": [
                    r.model_copy(update={"env": redactor.env(r.env), "argv": redactor.argv(r.argv)})
                    for r in plan.ranks
                ]
            }
        )
        return redactor.text(renderer(safe, deployment, fmt))

    return render
