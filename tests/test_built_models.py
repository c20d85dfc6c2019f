"""Every model tandem builds is named once (``tandem.built_models``), and a hint for a missing
one names the command that builds it, never a download (newcomer review, defect 1)."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from tandem import built_models
from tandem.built_models import build_command, is_built, missing_hint, shape_repo_id, tiny_repo_id
from tandem.cli import cli
from tandem.models.real import SOURCES
from tandem.models.shapes import SHAPES
from tandem.models.tiny import ARCHITECTURES


def test_the_builders_make_exactly_the_models_named_here():
    assert tuple(ARCHITECTURES) == built_models.TINY_ARCHITECTURES
    assert tuple(SHAPES) == built_models.SHAPE_PRESETS
    assert {name: s.repo_id for name, s in SOURCES.items()} == built_models.REAL_MODELS


@pytest.mark.parametrize(
    ("repo_id", "command"),
    [
        ("tandem-org/tiny-deepseek-v3", "tandem model tiny"),
        ("tandem-org/tiny-llama", "tandem model tiny --arch llama"),
        ("tandem-org/smollm2-135m-instruct", "tandem model real"),
        ("tandem-org/gemma3-270m", "tandem model real gemma3-270m"),
        ("tandem-shapes/llama-3.1-8b", "tandem model shape llama-3.1-8b"),
        (
            "tandem-shapes/deepseek-v3-4l-small",
            "tandem model shape deepseek-v3 --layers 4 --scale-down",
        ),
        ("tandem-org/not-a-model", None),
        ("deepseek-ai/DeepSeek-V4-Flash", None),
    ],
)
def test_the_command_that_builds_each_id(repo_id, command):
    assert build_command(repo_id) == command


def test_every_id_a_builder_gives_maps_back_to_a_command_that_parses():
    ids = [tiny_repo_id(a) for a in ARCHITECTURES]
    ids += list(built_models.REAL_MODELS.values())
    ids += [shape_repo_id(p, layers=4, scale_down=s) for p in SHAPES for s in (False, True)]
    for repo_id in ids:
        command = build_command(repo_id)
        assert command is not None, repo_id
        words = shlex.split(command)[1:]
        ctx = cli.make_context("tandem", list(words[:1]), resilient_parsing=True)
        group = cli.get_command(ctx, words[0])
        sub = group.get_command(ctx, words[1])
        sub.make_context(words[1], words[2:])  # raises on an argument the command refuses


def test_a_hint_for_a_built_model_never_offers_a_download():
    for repo_id in ("tandem-org/tiny-deepseek-v3", "tandem-shapes/gemma-3-4b", "tandem-org/x"):
        assert is_built(repo_id)
        hint = missing_hint(repo_id)
        assert hint and "tandem model" in hint and "hf download" not in hint
    assert missing_hint("Qwen/Qwen3-8B") is None


def test_model_real_lists_both_models_in_its_help():
    result = CliRunner().invoke(cli, ["model", "real", "--help"])
    assert result.exit_code == 0
    assert "gemma3-270m" in result.output and "smollm2-135m" in result.output
