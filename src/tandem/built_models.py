"""The models tandem builds into the Hugging Face cache itself: their repo ids, and the command
that builds each.

No hub serves these ids (``tandem-org/...``, ``tandem-shapes/...``): ``tandem model tiny``,
``real`` and ``shape`` write them into the cache as a download would leave them. Every hint for
a missing model (the planner, the preflight, a boot log's cause) asks ``build_command`` first,
so that it names the command that builds the model and never a download: a download of such an
id fails, and whoever registered that name on a hub would be downloaded next.

The builders (``tandem.models``) import torch and transformers; the names live here, below
every floor that gives a hint, and tests keep the builders' own lists equal to these.

Usage:
    build_command("tandem-org/tiny-deepseek-v3")     # 'tandem model tiny'
    build_command("tandem-shapes/llama-3.1-8b-4l")   # 'tandem model shape llama-3.1-8b --layers 4'
    build_command("Qwen/Qwen3-8B")                   # None: a hub model
"""

from __future__ import annotations

import re

TINY_ORG = "tandem-org"
"""The organisation of the tiny random-weight models and of the real ones tandem converts."""
SHAPES_ORG = "tandem-shapes"
"""The organisation of the random-weight models of a real checkpoint's shape."""
TINY_ARCHITECTURES = ("deepseek_v3", "llama", "mistral", "mixtral", "qwen2", "qwen3")
"""``tandem model tiny --arch``: ``tandem.models.tiny.ARCHITECTURES``."""
DEFAULT_TINY_ARCH = "deepseek_v3"
REAL_MODELS = {
    "smollm2-135m": f"{TINY_ORG}/smollm2-135m-instruct",
    "gemma3-270m": f"{TINY_ORG}/gemma3-270m",
}
"""``tandem model real NAME`` -> the repo id it converts into (``tandem.models.real.SOURCES``)."""
DEFAULT_REAL_MODEL = "smollm2-135m"
SHAPE_PRESETS = (
    "llama-3.1-8b",
    "deepseek-v2-lite",
    "gemma-3-4b",
    "deepseek-v3",
    "qwen3-30b-a3b",
    "mixtral-8x7b",
)
"""``tandem model shape PRESET``: ``tandem.models.shapes.SHAPES``."""


def tiny_repo_id(arch: str) -> str:
    """The repo id of ``tandem model tiny --arch ARCH``: ``tandem-org/tiny-deepseek-v3``."""
    return f"{TINY_ORG}/tiny-{arch.replace('_', '-')}"


def shape_repo_id(preset: str, *, layers: int | None = None, scale_down: bool = False) -> str:
    """``tandem-shapes/<preset>``, with ``-<N>l`` when layers are cut and ``-small`` scaled."""
    name = preset + (f"-{layers}l" if layers else "") + ("-small" if scale_down else "")
    return f"{SHAPES_ORG}/{name}"


def is_built(repo_id: str) -> bool:
    """True for an id in an organisation only tandem builds into (no hub has it)."""
    return repo_id.partition("/")[0] in (TINY_ORG, SHAPES_ORG)


def build_command(repo_id: str) -> str | None:
    """The ``tandem model`` command that builds ``repo_id`` into the cache, or None when
    tandem does not build it (a hub model, or an id of tandem's organisations that no command
    makes)."""
    org, _, name = repo_id.partition("/")
    for real, real_id in REAL_MODELS.items():
        if repo_id == real_id:
            return "tandem model real" + ("" if real == DEFAULT_REAL_MODEL else f" {real}")
    if org == TINY_ORG and name.startswith("tiny-"):
        arch = name.removeprefix("tiny-").replace("-", "_")
        if arch in TINY_ARCHITECTURES:
            return "tandem model tiny" + ("" if arch == DEFAULT_TINY_ARCH else f" --arch {arch}")
    if org == SHAPES_ORG:
        for preset in SHAPE_PRESETS:
            match = re.fullmatch(re.escape(preset) + r"(?:-(\d+)l)?(-small)?", name)
            if match:
                return (
                    f"tandem model shape {preset}"
                    + (f" --layers {match[1]}" if match[1] else "")
                    + (" --scale-down" if match[2] else "")
                )
    return None


def missing_hint(repo_id: str) -> str | None:
    """The fix for a missing model tandem builds, or None for a hub model.

    Usage:
        missing_hint("tandem-org/tiny-deepseek-v3")
        # 'build it with `tandem model tiny` (tandem makes this model; no hub has it)'
    """
    if not is_built(repo_id):
        return None
    command = build_command(repo_id)
    if command is None:
        return (
            f"no tandem command builds {repo_id} and no hub has it: use one of "
            "`tandem model tiny`, `tandem model real` or `tandem model shape PRESET` and their "
            "repo ids"
        )
    return f"build it with `{command}` (tandem makes this model; no hub has it)"
