"""Model readers: ``config.json`` and the weight bytes of a checkpoint, without loading weights.

Where the facts come from, in order (the first found wins):

1. ``--config FILE``: a ``config.json`` alone, its weights counted from the architecture
   (``tandem.plan.estimate``): a model planned before anything is downloaded.
2. ``--model-dir DIR``: a snapshot folder with ``config.json`` and ``*.safetensors``.
3. The Hugging Face cache of the recipe's model (``cache_root``, ``$HF_HOME`` or
   ``~/.cache/huggingface``): ``hub/models--ORG--NAME/snapshots/<commit>`` for the recipe's
   revision, or the recipe's ``model.path`` when it exists on this machine.
4. The data shipped with tandem for the built-in DeepSeek recipes' models
   (``tandem/data/models/ORG--NAME/``).
5. The cache's ``config.json`` without weights (``hf download REPO config.json``), estimated
   as in 1.

Weight bytes are exact when read from a checkpoint: every safetensors file starts with an 8-byte
little-endian header length and a JSON header giving each tensor's dtype, shape and byte range.
Each tensor is sorted into a *part* (routed experts, shared experts, attention, dense MLP,
embedding, LM head, drafter/MTP layers, other) by its name, and the bytes every TP rank holds
whole (norms, MoE routers, MLA's down-projections) are counted as replicated.
"""

from __future__ import annotations

import json
import os
import re
import struct
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tandem import hf_cache, wire
from tandem.built_models import missing_hint
from tandem.errors import PlanError
from tandem.plan.estimate import REQUIRED, estimated_parts, text_config
from tandem.spec.recipe import ModelSource

PartRole = Literal[
    "routed_experts",
    "shared_experts",
    "attention",
    "dense_mlp",
    "embedding",
    "lm_head",
    "drafter",
    "other",
]


class WeightPart(BaseModel):
    """Bytes of one kind of weight in a checkpoint."""

    name: str
    role: PartRole
    bytes: int = Field(ge=0, description="Bytes stored, all ranks together.")
    replicated_bytes: int = Field(
        default=0,
        ge=0,
        description="Of `bytes`, what every TP rank "
        "holds whole (norms, routers, MLA down-projections).",
    )
    active_bytes_per_step: int | None = Field(
        default=None, description="Drafter only: bytes read per verify step, whole model."
    )
    source: str = Field(default="safetensors header", description="Where the figure comes from.")


class ModelFacts(BaseModel):
    """What the planner knows about a model: its config and its weight bytes by part."""

    repo_id: str
    config: dict[str, Any]
    parts: list[WeightPart]
    total_bytes: int
    source: str = Field(description="`model-dir`, `hf-cache` or `shipped`, with the path.")
    notes: list[str] = Field(default_factory=list)
    observations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Shipped vLLM boot figures (`kind: boot`) and reported "
        "figures (`kind: claim`) for this model, each with its source.",
    )

    def part_bytes(self, *roles: str) -> int:
        return sum(p.bytes for p in self.parts if p.role in roles)


# ---------------------------------------------------------------------------------------------
# safetensors headers


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {dtype, shape, data_offsets} of one safetensors file, reading only its header.

    Raises:
        PlanError: the file is not a safetensors file.
    """
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise PlanError("not a safetensors file (shorter than 8 bytes)", file=str(path))
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:
            raise PlanError(
                f"safetensors header of {length} bytes is implausible",
                file=str(path),
                hint="the file is damaged; download it again",
            )
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise PlanError("safetensors header is not JSON", file=str(path)) from exc
    header.pop("__metadata__", None)
    return header


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_REPLICATED = re.compile(
    r"(q_a_proj|kv_a_proj_with_mqa|wkv_a|fused_wqa_wkv|mlp\.gate\.weight|"
    r"block_sparse_moe\.gate\.weight|router|e_score_correction_bias)"
)


def classify_tensor(name: str, num_hidden_layers: int) -> PartRole:
    """Which part a tensor belongs to, from its name (Hugging Face naming)."""
    if "embed_tokens" in name or name.endswith("wte.weight"):
        return "embedding"
    if name.startswith("lm_head") or ".lm_head" in name:
        return "lm_head"
    if (m := _LAYER.search(name)) and int(m.group(1)) >= num_hidden_layers:
        return "drafter"
    if "mtp" in name or "dspark" in name or "draft" in name:
        return "drafter"
    if "shared_expert" in name:
        return "shared_experts"
    if ".experts." in name:
        return "routed_experts"
    if "attn" in name or "attention" in name:
        return "attention"
    if ".mlp." in name or "feed_forward" in name:
        return "dense_mlp"
    return "other"


def parts_from_headers(
    headers: list[dict[str, dict[str, Any]]], num_hidden_layers: int
) -> list[WeightPart]:
    """Sum tensor bytes into parts; 1-D tensors and known replicated projections are replicated."""
    totals: dict[str, list[int]] = {}
    for header in headers:
        for name, info in header.items():
            start, end = info["data_offsets"]
            size = end - start
            role = classify_tensor(name, num_hidden_layers)
            entry = totals.setdefault(role, [0, 0])
            entry[0] += size
            if len(info.get("shape", [])) <= 1 or _REPLICATED.search(name):
                entry[1] += size
    order = list(PartRole.__args__)  # type: ignore[attr-defined]
    return [
        WeightPart(name=role.replace("_", " "), role=role, bytes=b, replicated_bytes=r)
        for role, (b, r) in sorted(totals.items(), key=lambda kv: order.index(kv[0]))
    ]


# ---------------------------------------------------------------------------------------------
# finding a model


def facts_from_dir(folder: Path, repo_id: str, source: str) -> ModelFacts:
    """Read ``config.json`` and every ``*.safetensors`` header of a snapshot folder.

    Raises:
        PlanError: no config.json, or no safetensors files.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise PlanError(
            f"no config.json in {folder}",
            hint="point --model-dir at a snapshot folder holding config.json and *.safetensors",
        )
    config = json.loads(config_path.read_text())
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise PlanError(
            f"no *.safetensors files in {folder}",
            hint="download the weights, or leave out --model-dir to use shipped data",
        )
    headers = [read_safetensors_header(f) for f in files]
    parts = parts_from_headers(headers, int(config.get("num_hidden_layers", 0)))
    return ModelFacts(
        repo_id=repo_id,
        config=config,
        parts=parts,
        total_bytes=sum(p.bytes for p in parts),
        source=f"{source}: {folder}",
    )


def facts_from_config(config_path: Path, repo_id: str, source: str) -> ModelFacts:
    """Facts from a ``config.json`` alone: its weights counted from the architecture
    (``tandem.plan.estimate``), for a model not downloaded yet.

    Raises:
        PlanError: the file is not a JSON object with the sizes every transformer has.
    """
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(
            f"cannot read it as JSON ({exc})", file=str(config_path), field="--config"
        ) from None
    config = text_config(raw) if isinstance(raw, dict) else {}
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise PlanError(
            f"is not a model's config.json: it lacks {', '.join(missing)}",
            file=str(config_path),
            field="--config",
            hint="pass the config.json from the model's Hub page (Files: config.json)",
        )
    parts = [
        WeightPart(
            name=role.replace("_", " "),
            role=role,
            bytes=size,
            replicated_bytes=whole,
            source="estimate from config.json",
        )
        for role, size, whole in estimated_parts(config)
    ]
    return ModelFacts(
        repo_id=repo_id,
        config=config,
        parts=parts,
        total_bytes=sum(p.bytes for p in parts),
        source=f"{source}: {config_path}",
        notes=[
            "weights estimated from config.json, no checkpoint read (parameters counted from "
            "the architecture x bytes per parameter): with the weights in the cache or "
            "--model-dir the plan reads them exactly"
        ],
    )


def hf_cache_snapshot(repo_id: str, revision: str, roots: list[Path]) -> Path | None:
    """The cached snapshot folder of ``repo_id`` at ``revision`` under any of ``roots``."""
    for root in roots:
        repo = hf_cache.repo_dir(root, repo_id)
        if not repo.is_dir():
            continue
        ref = hf_cache.ref_file(repo, revision)
        commit = ref.read_text().strip() if ref.is_file() else revision
        snapshot = hf_cache.snapshot_dir(repo, commit)
        if (snapshot / "config.json").is_file():
            return snapshot
    return None


def _shipped_folder(repo_id: str) -> Any:
    """Where tandem ships the data of ``repo_id``: ``tandem/data/models/ORG--NAME``."""
    return resources.files("tandem") / "data" / "models" / repo_id.replace("/", "--")


def shipped_facts(repo_id: str) -> ModelFacts | None:
    """The shipped config.json and weights.json of ``repo_id``, or None."""
    folder = _shipped_folder(repo_id)
    if not folder.joinpath("config.json").is_file():
        return None
    config = json.loads(folder.joinpath("config.json").read_text())
    weights = json.loads(folder.joinpath("weights.json").read_text())
    parts = [WeightPart.model_validate(p) for p in weights["parts"]]
    notes = [weights["note"], f"checkpoint size: {weights['total_bytes_source']}"]
    return ModelFacts(
        repo_id=repo_id,
        config=config,
        parts=parts,
        total_bytes=weights["total_bytes"],
        source=f"shipped: tandem/data/models/{repo_id.replace('/', '--')}",
        notes=notes,
    )


def shipped_observations(repo_id: str) -> list[dict[str, Any]]:
    """Measured boots and reported figures shipped for ``repo_id`` (empty when none)."""
    path = _shipped_folder(repo_id) / "observations.json"
    if not path.is_file():
        return []
    return list(json.loads(path.read_text())["observations"])


def load_model_facts(
    repo_id: str,
    *,
    model_dir: Path | None = None,
    config_path: Path | None = None,
    revision: str = "main",
    cache_roots: list[Path] | None = None,
    local_path: str | None = None,
) -> ModelFacts:
    """Find the model's facts where the module docstring says, in its order.

    Raises:
        PlanError: nothing found; the hint says which flag to pass.
    """
    facts = _find_model_facts(repo_id, model_dir, config_path, revision, cache_roots, local_path)
    return facts.model_copy(update={"observations": shipped_observations(repo_id)})


def facts_of(
    model: ModelSource, *, model_dir: Path | None = None, config_path: Path | None = None
) -> ModelFacts:
    """The facts of a recipe's model, looked for where the recipe says it is (``model.path``,
    its ``cache_root`` and revision), or in ``model_dir`` or ``config_path``.

    Raises:
        PlanError: nothing found; the hint says which flag to pass.
    """
    return load_model_facts(
        model.repo_id,
        model_dir=model_dir,
        config_path=config_path,
        revision=model.revision,
        cache_roots=default_cache_roots(model.cache_root),
        local_path=model.path,
    )


def _find_model_facts(
    repo_id: str,
    model_dir: Path | None,
    config_path: Path | None,
    revision: str,
    cache_roots: list[Path] | None,
    local_path: str | None,
) -> ModelFacts:
    if config_path is not None:
        return facts_from_config(config_path, repo_id, "--config")
    if model_dir is not None:
        return facts_from_dir(Path(model_dir), repo_id, "model-dir")
    if (
        local_path
        and (Path(local_path) / "config.json").is_file()
        and any(Path(local_path).glob("*.safetensors"))
    ):
        return facts_from_dir(Path(local_path), repo_id, "model.path")
    roots = cache_roots if cache_roots is not None else default_cache_roots()
    snapshot = hf_cache_snapshot(repo_id, revision, roots)
    if snapshot is not None and any(snapshot.glob("*.safetensors")):
        return facts_from_dir(snapshot, repo_id, "hf-cache")
    shipped = shipped_facts(repo_id)
    if shipped is not None:
        return shipped
    if snapshot is not None:  # the config downloaded alone, the weights not (yet)
        return facts_from_config(snapshot / "config.json", repo_id, "hf-cache config.json")
    raise PlanError(
        f"no config.json and weights found for {repo_id}",
        hint=missing_hint(repo_id)
        or "pass --config with the model's config.json (from its Hub page: plan needs no "
        "weights), --model-dir with a snapshot folder, or set HF_HOME to a cache holding it",
    )


def default_cache_roots(cache_root: str | None = None) -> list[Path]:
    """HF homes to search: the recipe's ``cache_root``, ``$HF_HOME``, ``~/.cache/huggingface``."""
    roots = []
    if cache_root:
        roots.append(Path(cache_root))
    if os.environ.get(wire.HF_HOME):
        roots.append(Path(os.environ[wire.HF_HOME]))
    roots.append(Path(hf_cache.DEFAULT_HOME).expanduser())
    return roots
