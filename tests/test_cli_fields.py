"""CLI options generated from the config models' fields: the model's default is the option's,
and its bounds and description too (STYLE §5, one description per option)."""

from __future__ import annotations

import click
import pytest

from tandem.bench.config import BenchConfig
from tandem.cli.bench import bench_command, run_command
from tandem.cli.eval import FALLBACK, eval_command, gpqa_command
from tandem.eval.log import SamplingParams
from tandem.eval.runner import GPQAConfig


def parsed_defaults(group: click.Group, command: click.Command, args: list[str]) -> dict:
    """What the command receives when only ``args`` are given (callbacks applied). Parsed
    under its group's context, as the CLI does: click keeps the help option a command is
    first asked for, and a context without the group's settings would drop `-h`."""
    parent = click.Context(group, info_name=group.name, **group.context_settings)
    return command.make_context(command.name, args, parent=parent).params


def test_bench_run_takes_every_default_from_the_bench_config():
    params = parsed_defaults(bench_command, run_command, ["--url", "http://x"])
    model = BenchConfig(url="http://x")
    shared = set(params) & set(BenchConfig.model_fields) - {"url", "model", "api_key"}
    assert len(shared) >= 18
    assert {name: params[name] for name in shared} == {
        name: getattr(model, name) for name in shared
    }


def test_eval_gpqa_takes_every_default_from_the_gpqa_config():
    params = parsed_defaults(
        eval_command, gpqa_command, ["--csv", "q.csv", "--out", "o", "--url", "http://x"]
    )
    model = GPQAConfig(csv="q.csv", url="http://x", out_dir="o")
    cli_only = {"url", "model", "api_key", "resume", "out_dir"}
    top = set(params) & set(GPQAConfig.model_fields) - cli_only
    assert {name: params[name] for name in top} == {name: getattr(model, name) for name in top}
    sampling = set(params) & set(SamplingParams.model_fields)
    assert {name: params[name] for name in sampling} == {
        name: getattr(model.sampling, name) for name in sampling
    }
    assert params["fallback_max_tokens"] == model.fallback_sampling.max_tokens == 64
    assert params["fallback_chat_template_kwargs"] == FALLBACK.chat_template_kwargs


@pytest.mark.parametrize(
    "command, flag, field",
    [
        (run_command, "--timeout", BenchConfig.model_fields["request_timeout_s"]),
        (run_command, "--input-tokens", BenchConfig.model_fields["input_tokens"]),
        (gpqa_command, "--retry-budget", GPQAConfig.model_fields["retry_budget_s"]),
        (gpqa_command, "--max-tokens", SamplingParams.model_fields["max_tokens"]),
    ],
    ids=["bench timeout", "bench input tokens", "eval retry budget", "eval max tokens"],
)
def test_the_help_is_the_field_description(command, flag, field):
    (option,) = [p for p in command.params if flag in getattr(p, "opts", [])]
    assert option.help == field.description


def test_supervise_takes_its_policy_from_the_model_and_hands_it_on_whole():
    """A fleet's supervisor starts one per group with its own options: what it hands on parses
    back to the same policy (a switch turned off included)."""
    from tandem.cli.options import as_options
    from tandem.cli.supervise import supervise_command
    from tandem.operations.supervisor import SupervisorPolicy

    def parsed(args: list[str]) -> dict:
        params = supervise_command.make_context("supervise", args).params
        return {k: v for k, v in params.items() if k not in ("name", "group")}

    assert SupervisorPolicy(**parsed([])) == SupervisorPolicy()
    chosen = SupervisorPolicy(
        **parsed(["--stall", "60", "--no-router-membership", "--backoff", "0"])
    )
    assert (chosen.stall_s, chosen.membership, chosen.backoff_s) == (60, False, 0)
    handed_on = as_options(chosen, list(parsed([])))
    assert "--no-router-membership" in handed_on and "--stall=60.0" in handed_on
    assert SupervisorPolicy(**parsed(handed_on)) == chosen
