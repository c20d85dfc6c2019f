"""vLLM 0.25.1's profile-run peak and CUDA-graph estimate, term by term, against what torch's
memory history and vLLM's own log lines showed on the H200 (benchmarks/gpu/results/planner.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.plan.profile_run import (
    ProfileSettings,
    activation_peak,
    capture_sizes,
    cudagraph_estimate,
    mla_workspace_tokens,
    moe_layer_flags,
    moe_workspace_bytes,
    v2_model_runner,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "models"
MIB = 1024**2
H200_SMS = 132


def _config(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


def _settings(**kw) -> ProfileSettings:
    base = dict(max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=8192, block_size=16)
    return ProfileSettings(**{**base, **kw})


def test_runner_choice_follows_vllm_config():
    assert v2_model_runner(_config("llama-3.1-8b"))
    assert v2_model_runner(_config("deepseek-v2-lite-13l"))  # MoE, but listed for V2
    assert not v2_model_runner(_config("deepseek-v3-4l"))
    assert not v2_model_runner(_config("qwen3-30b-a3b-8l"))


def test_moe_layers_follow_each_family_rule():
    assert moe_layer_flags(_config("deepseek-v3-5l")) == [False, False, False, True, True]
    assert moe_layer_flags(_config("deepseek-v2-lite-13l"))[:2] == [False, True]
    assert all(moe_layer_flags(_config("qwen3-30b-a3b-8l")))
    assert not any(moe_layer_flags(_config("llama-3.1-8b")))


@pytest.mark.parametrize(
    "max_model_len, max_num_seqs, block, tokens",
    [(8192, 256, 16, 65536), (2048, 256, 16, 16384), (2048, 256, 64, 65536), (1024, 64, 16, 8192)],
)
def test_mla_profile_workspace_tokens(max_model_len, max_num_seqs, block, tokens):
    assert mla_workspace_tokens(max_model_len, max_num_seqs, block) == tokens


def test_fused_moe_workspace_matches_the_probed_buffers():
    # torch's memory history: 1,792 MiB (DeepSeek-V3), 1,344 (Mixtral), 512 (Qwen3-30B-A3B)
    assert moe_workspace_bytes(_config("deepseek-v3-4l"), 8192, 1) == 1792 * MIB
    assert moe_workspace_bytes(_config("mixtral-8x7b-4l"), 8192, 1) == 1344 * MIB
    assert moe_workspace_bytes(_config("qwen3-30b-a3b-8l"), 8192, 1) == 512 * MIB


@pytest.mark.parametrize(
    "model, eager, seqs, length, mib, moment",
    [
        # measured (vLLM's torch peak, probe history): 5,057 / 4,889 / 6,849 / 2,496 MiB
        ("deepseek-v3-4l", True, 256, 8192, 5057, "attention of layer 0"),
        ("deepseek-v3-4l", False, 256, 8192, 4889, "attention of layer 0"),
        ("deepseek-v3-5l", True, 256, 8192, 6849, "attention of layer 4"),
        ("deepseek-v3-4l", True, 256, 2048, 2504, "MLP of layer 3"),
        ("mixtral-8x7b-4l", True, 256, 8192, 1728, "attention of layer 1"),
        ("qwen3-30b-a3b-8l", True, 256, 8192, 1172, "sampler"),
        ("llama-3.1-8b", True, 256, 8192, 896, "MLP of layer 0"),
        ("gemma-3-4b", True, 256, 8192, 712, "MLP of layer 0"),
    ],
)
def test_activation_peak_is_the_probed_moment(model, eager, seqs, length, mib, moment):
    settings = _settings(enforce_eager=eager, max_num_seqs=seqs, max_model_len=length)
    peak = activation_peak(_config(model), settings, H200_SMS)
    assert abs(peak.bytes / MIB - mib) <= 10, peak
    assert peak.moment.startswith(moment)


def test_capture_sizes_as_vllm_logged_them():
    # "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)"
    sizes = capture_sizes(_settings())
    assert (len(sizes), max(sizes), len([s for s in sizes if s <= 256])) == (51, 512, 35)
    # "PIECEWISE=19 (largest=128), FULL=11 (largest=64)" at --max-num-seqs 64
    small = capture_sizes(_settings(max_num_seqs=64))
    assert (len(small), max(small), len([s for s in small if s <= 64])) == (19, 128, 11)


@pytest.mark.parametrize(
    "model, seqs, full_first_mib, total_gib",
    [
        ("deepseek-v3-4l", 256, 2134, 2.21),  # FULL first capture 2,134 MiB, 2.21 GiB total
        ("deepseek-v3-4l", 64, 516, 0.55),
        ("mixtral-8x7b-4l", 256, 128, 0.26),
        ("qwen3-30b-a3b-8l", 256, 132, 0.21),
        ("qwen3-30b-a3b-8l", 1024, 256, 0.35),
    ],
)
def test_cudagraph_estimate_against_vllms_log(model, seqs, full_first_mib, total_gib):
    graphs = cudagraph_estimate(_config(model), _settings(max_num_seqs=seqs))
    assert abs(graphs.full_first_bytes / MIB - full_first_mib) <= 0.05 * full_first_mib + 8
    assert abs(graphs.bytes / 1024**3 - total_gib) <= 0.07
