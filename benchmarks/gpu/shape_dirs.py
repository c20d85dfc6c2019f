#!/usr/bin/env python3
"""Shape models without weights: a folder vLLM serves with ``--load-format dummy``, and the
config.json + safetensors header the planner reads, for each ``preset:layers``.

Runs anywhere, in seconds, with no GPU: the model is built on torch's ``meta`` device, so no
weight is ever made. vLLM's dummy loader allocates and fills the same parameters on the GPU, so
its ``Model loading took`` and everything after it (profile run, CUDA-graph estimate, KV pool)
are those of the real checkpoint, while the 30-75 GB a DeepSeek-V3 cut would take never touch
the device's 64 GB disk.

    python3 benchmarks/gpu/shape_dirs.py .gpu/shapes deepseek-v3:4 qwen3-30b-a3b:8 llama-3.1-8b
    # serve: DEST/serve/<name>   (config.json, generation_config.json, tokenizer)
    # plan:  DEST/models/<name>  (config.json, model.safetensors header only -> tests/fixtures/gpu)
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

DTYPES = {"torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float16": "F16"}


def write_header(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A safetensors file holding only its header: name -> dtype, shape, byte range."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def build(dest: Path, preset: str, layers: int | None) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from tandem.models.shapes import SHAPES, shape_repo_id
    from tandem.models.tiny import _train_tokenizer

    name = shape_repo_id(preset, layers=layers).split("/", 1)[1]
    serve, model = dest / "serve" / name, dest / "models" / name
    serve.mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(0)
    tokenizer.save_pretrained(serve)
    factory, architecture = SHAPES[preset]
    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = factory(layers, False, **ids)
    config.architectures = [architecture]
    config.dtype = torch.bfloat16
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    config.save_pretrained(serve)
    saved = json.loads((serve / "config.json").read_text())
    for alias, field in config.attribute_map.items():  # e.g. num_experts for older readers
        if field in saved and alias not in saved:
            saved[alias] = saved[field]
    (serve / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    (serve / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    (model / "config.json").write_text((serve / "config.json").read_text())
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    tensors = {
        k: (DTYPES[str(v.dtype)], list(v.shape), v.numel() * v.element_size())
        for k, v in built.state_dict().items()
        if k not in tied
    }
    write_header(model / "model.safetensors", tensors)
    total = sum(t[2] for t in tensors.values())
    print(f"{name}: {len(tensors)} tensors, {total / 2**30:.2f} GiB of weights", flush=True)
    return name


def main() -> None:
    dest = Path(sys.argv[1])
    for spec in sys.argv[2:]:
        preset, _, layers = spec.partition(":")
        build(dest, preset, int(layers) if layers else None)


if __name__ == "__main__":
    main()
