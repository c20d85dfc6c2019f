"""Builds the tiny random-weight models that the CPU build of vLLM serves in tests.

tandem never mocks the engine, so every backend, the bench and the eval run against a real vLLM
serving a real model. On a machine without a GPU that model has to be tiny, and it has to be
made here: downloading weights would make the test bed depend on the network and on someone
else's repository. This module owns that model: its architecture configs, its tokenizer and its
place in the Hugging Face cache, where vLLM finds it with ``HF_HUB_OFFLINE=1`` exactly as it
would find a real download.

Algorithm of ``build_tiny_model``:

1. Train a 2048-entry byte-level BPE tokenizer on a corpus generated in code from a fixed word
   list and a seeded sentence generator, so it depends on nothing outside the package.
2. Make the architecture's config (``ARCHITECTURES``) with the tokenizer's special-token ids and
   a vocabulary padded to a multiple of 64, seed torch, build the model in bf16, and save it
   with safetensors into a temporary folder next to the cache.
3. Hash every file (sha256); the snapshot's 40-hex ``commit`` is the sha1 of the sorted
   ``name sha256`` manifest, so the same inputs and package versions give the same commit.
4. Move the files into the hub layout: ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` as
   relative symlinks to the blobs, and ``refs/main`` holding the commit. A snapshot that already
   exists with that commit is left untouched.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from tandem import hf_cache
from tandem.built_models import DEFAULT_TINY_ARCH, tiny_repo_id
from tandem.errors import SpecError
from tandem.models.store import store_built

__all__ = ["ARCHITECTURES", "DEFAULT_ARCH", "TinyModel", "build_tiny_model", "tiny_repo_id"]

DEFAULT_ARCH = DEFAULT_TINY_ARCH
VOCAB_SIZE = 2048
VOCAB_MULTIPLE = 64
MAX_POSITION_EMBEDDINGS = 4096

BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
USER, ASSISTANT = "<|User|>", "<|Assistant|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPECIAL_TOKENS = [BOS, EOS, PAD, USER, ASSISTANT]
THINK_TOKENS = [THINK_OPEN, THINK_CLOSE]

# DeepSeek-V3.1 style: the system prompt follows BOS, each assistant turn is closed by EOS, and
# the generation prompt ends with <think> when the caller asks for thinking
# (chat_template_kwargs: {thinking: true}) and with </think> otherwise.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages if message['role'] == 'system' %}{{ message['content'] }}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}"
    + ASSISTANT
    + THINK_CLOSE
    + "{{ message['content'] }}"
    "{{ eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    + ASSISTANT
    + "{%- if thinking is defined and thinking %}"
    + THINK_OPEN
    + "{%- else %}"
    + THINK_CLOSE
    + "{%- endif %}{%- endif %}"
)

# Words the corpus is made of; syllables make up invented words so that BPE has enough
# distinct pieces to fill 2048 entries.
_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
    "by",
    "from",
    "at",
    "as",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "do",
    "does",
    "did",
    "not",
    "no",
    "yes",
    "and",
    "or",
    "but",
    "if",
    "then",
    "else",
    "when",
    "while",
    "because",
    "so",
    "that",
    "this",
    "these",
    "those",
    "it",
    "its",
    "model",
    "node",
    "rank",
    "leader",
    "worker",
    "token",
    "cache",
    "memory",
    "tensor",
    "parallel",
    "pipeline",
    "expert",
    "layer",
    "head",
    "attention",
    "latent",
    "query",
    "key",
    "value",
    "weight",
    "bias",
    "vector",
    "matrix",
    "batch",
    "request",
    "response",
    "server",
    "client",
    "engine",
    "kernel",
    "thread",
    "process",
    "network",
    "socket",
    "address",
    "port",
    "host",
    "device",
    "chip",
    "core",
    "number",
    "answer",
    "question",
    "reason",
    "think",
    "step",
    "first",
    "second",
    "third",
    "last",
    "next",
    "small",
    "large",
    "fast",
    "slow",
    "good",
    "bad",
    "true",
    "false",
    "open",
    "close",
    "start",
    "stop",
    "run",
    "wait",
    "send",
    "read",
    "write",
    "load",
    "save",
    "build",
    "test",
    "check",
    "plan",
    "render",
    "launch",
    "serve",
    "measure",
    "report",
    "time",
    "second",
    "minute",
    "hour",
    "day",
    "year",
    "water",
    "river",
    "mountain",
    "city",
    "house",
    "garden",
    "tree",
    "flower",
    "bird",
    "fish",
    "stone",
    "light",
    "dark",
    "warm",
    "cold",
    "red",
    "green",
    "blue",
    "yellow",
    "white",
    "black",
    "north",
    "south",
    "east",
    "west",
    "left",
    "right",
    "up",
    "down",
    "inside",
    "outside",
]
_SYLLABLES = [
    "ka",
    "ri",
    "to",
    "mu",
    "se",
    "na",
    "lo",
    "vi",
    "pe",
    "da",
    "zu",
    "fo",
    "gi",
    "ha",
    "ne",
    "ro",
    "sa",
    "ti",
    "ku",
    "me",
    "bo",
    "ya",
    "wu",
    "xe",
    "qi",
    "ju",
    "la",
]
_PUNCTUATION = [".", ".", ".", "?", "!", ",", ";", ":"]


class TinyModel(BaseModel):
    """What ``build_tiny_model`` built and where it lies in the cache."""

    model_config = ConfigDict(frozen=True)

    repo_id: str = Field(description="Hub repo id vLLM is given, e.g. `tandem-org/tiny-llama`.")
    arch: str = Field(description="Key in ARCHITECTURES, e.g. `deepseek_v3`.")
    commit: str = Field(description="40-hex snapshot id, a digest of the files' contents.")
    snapshot_path: Path = Field(description="`.../hub/models--ORG--NAME/snapshots/<commit>`.")
    parameter_count: int = Field(description="Number of model parameters.")
    size_bytes: int = Field(description="Total size of the snapshot's files in bytes.")


def _deepseek_v3(**common: int) -> PretrainedConfig:
    # kv_lora_rank + qk_rope_head_dim must be 576: vLLM's CPU_MLA decode kernel supports only
    # that latent size. Everything else is as small as the MoE routing allows.
    return DeepseekV3Config(
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        q_lora_rank=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        num_nextn_predict_layers=0,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        rope_scaling=None,
        **common,
    )


SMALL_DENSE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The shape the dense families share: small enough to build in seconds, with grouped KV heads
(4 query heads on 2) so tensor parallel 2 splits both."""


def _small(config: type[PretrainedConfig], **shape: Any) -> Callable[..., PretrainedConfig]:
    """A factory of ``config`` at ``SMALL_DENSE``, ``shape`` over it (what the family needs)."""
    return lambda **common: config(**{**SMALL_DENSE, **shape, **common})


ARCHITECTURES: dict[str, Callable[..., PretrainedConfig]] = {
    "deepseek_v3": _deepseek_v3,
    "llama": _small(LlamaConfig),
    "mistral": _small(MistralConfig, head_dim=64, sliding_window=128),
    "mixtral": _small(
        MixtralConfig,
        intermediate_size=256,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=None,
    ),
    "qwen2": _small(Qwen2Config, use_sliding_window=False),
    "qwen3": _small(Qwen3Config, head_dim=64, use_sliding_window=False),
}
"""Architecture name -> config factory. Each factory takes the shared fields (vocab size,
special-token ids, max_position_embeddings) as keyword arguments."""


def build_tiny_model(
    hf_home: Path, *, arch: str = DEFAULT_ARCH, repo_id: str | None = None, seed: int = 0
) -> TinyModel:
    """Build a tiny random-weight model and tokenizer into the Hugging Face cache under hf_home.

    Usage:
        tiny = build_tiny_model(Path("~/.cache/huggingface").expanduser())
        # HF_HOME=~/.cache/huggingface HF_HUB_OFFLINE=1 vllm serve tandem-org/tiny-deepseek-v3

    Args:
        hf_home: the folder ``HF_HOME`` points at; files go under ``hf_home/hub``.
        arch: a key of ``ARCHITECTURES``; default ``deepseek_v3`` (MLA + MoE).
        repo_id: hub id to store it as; default ``tandem-org/tiny-<arch>``.
        seed: seeds the weights and the tokenizer corpus.

    Returns:
        The ``TinyModel``; the same inputs and package versions give the same ``commit``, and
        building again over an identical snapshot changes nothing.

    Raises:
        SpecError: ``arch`` is not a known architecture.
    """
    if arch not in ARCHITECTURES:
        raise SpecError(
            f"unknown tiny-model architecture {arch!r}",
            field="arch",
            hint=f"use one of: {', '.join(ARCHITECTURES)}",
        )
    repo_id = repo_id or tiny_repo_id(arch)
    repo_dir = hf_cache.repo_dir(Path(hf_home), repo_id)
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo_dir, prefix=".build-") as tmp:
        staging = Path(tmp)
        tokenizer = _train_tokenizer(seed)
        tokenizer.save_pretrained(staging)
        config = ARCHITECTURES[arch](
            vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
            **special_token_ids(tokenizer),
            max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        )
        parameter_count = save_model(config, tokenizer, seed, staging)
        snapshot, commit, size_bytes = store_built(repo_dir, staging)
    return TinyModel(
        repo_id=repo_id,
        arch=arch,
        commit=commit,
        snapshot_path=snapshot,
        parameter_count=parameter_count,
        size_bytes=size_bytes,
    )


def _corpus(seed: int, sentences: int = 6000) -> Iterator[str]:
    """Seeded pseudo-text: known words, invented words, numbers and punctuation."""
    rng = random.Random(seed)
    invented = [
        "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(600)
    ]
    for _ in range(sentences):
        words = []
        for _ in range(rng.randint(4, 16)):
            pick = rng.random()
            if pick < 0.6:
                words.append(rng.choice(_WORDS))
            elif pick < 0.9:
                words.append(rng.choice(invented))
            else:
                words.append(str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        yield sentence[0].upper() + sentence[1:] + rng.choice(_PUNCTUATION)


@cache
def _train_tokenizer(seed: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of VOCAB_SIZE entries, wrapped with special tokens and chat template.

    Trained once per seed in a process (0.4 s): every architecture of ``tandem model tiny --all``
    and every shape preset shares it, and the builds only save and read it."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    bpe.add_tokens(THINK_TOKENS)
    # As DeepSeek's and Llama's tokenizers do, encoding with special tokens (vLLM's completions
    # route does; its chat route leaves that to the template) puts BOS first.
    bpe.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A",
                pair=f"{BOS} $A $B:1",
                special_tokens=[(BOS, bpe.token_to_id(BOS))],
            ),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_model(
    config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerFast,
    seed: int,
    staging: Path,
    device: str = "cpu",
) -> int:
    """Build ``config`` with seeded random bf16 weights on ``device``, write config, weights and
    generation_config into ``staging`` and return the parameter count: tiny and shape models."""
    config.dtype = torch.bfloat16
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(staging, safe_serialization=True)
    save_generation_config(tokenizer, staging)
    return model.num_parameters()


def special_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """BOS, EOS and PAD ids as a model's config and generation_config name them: the tokenizer
    decides them, and every model built here (tiny or of a real shape) must agree with it."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def save_generation_config(tokenizer: PreTrainedTokenizerFast, staging: Path) -> None:
    """Write ``generation_config.json`` with the token ids only: sampling defaults come from the
    caller or vLLM, never from a random model."""
    (staging / "generation_config.json").write_text(
        json.dumps(special_token_ids(tokenizer), indent=2, sort_keys=True) + "\n"
    )
