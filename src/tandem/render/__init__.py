"""Renderers turn a RankPlan into text another program runs: shell commands, JSON, manifests.

Every renderer is ``render(plan, deployment, fmt) -> str`` and registered here by target name,
so ``tandem render --target NAME`` finds it; it is imported only when used.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from tandem.errors import SpecError
from tandem.rankplan import RankPlan
from tandem.spec.deployment import Deployment


class Renderer(Protocol):
    def __call__(self, plan: RankPlan, deployment: Deployment, fmt: str) -> str: ...


# target -> "module:function"
TARGETS: dict[str, str] = {
    "process": "tandem.render.commands:render",
    "k8s": "tandem.render.kubernetes:render",
    "docker": "tandem.render.docker:render",
    "prometheus": "tandem.render.prometheus:render",
}

# target -> "module:function" returning {file name: text}, for ``tandem render --out DIR``
FILE_TARGETS: dict[str, str] = {
    "prometheus": "tandem.render.prometheus:files",
}


class FileRenderer(Protocol):
    def __call__(self, plan: RankPlan, deployment: Deployment) -> dict[str, str]: ...


def files_renderer_for(target: str) -> FileRenderer:
    """The renderer of a target that writes several files into a folder."""
    if target not in FILE_TARGETS:
        raise SpecError(f"--target {target} prints to stdout; --out is for a target that "
                        "writes several files", field="--out",
                        hint=f"use --out with {', '.join(FILE_TARGETS)}")
    module, _, function = FILE_TARGETS[target].partition(":")
    return getattr(importlib.import_module(module), function)


def renderer_for(target: str) -> Renderer:
    if target not in TARGETS:
        raise SpecError(f"unknown render target '{target}'", field="--target",
                        hint=f"use one of {', '.join(TARGETS)}")
    module, _, function = TARGETS[target].partition(":")
    return getattr(importlib.import_module(module), function)
