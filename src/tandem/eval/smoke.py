"""``tandem eval smoke``: the checks users run by hand right after "it boots", in a minute.

GPQA takes hours; a wrong chat template, a doubled BOS, a parser flag that breaks tool calls or
kernels that garble after a cold prefill show in a few requests. Each check is one verdict with
its evidence (the request and what came back):

- ``template``: the prompt tokens the server counts for a chat equal its own tokenizer's count
  of the templated prompt (``/tokenize``), the special prefix (BOS) appears once, ``max_tokens``
  ends an answer with ``finish_reason: length``, and a stop string ends it with ``stop`` exactly
  where the free answer had that string;
- ``determinism``: greedy decoding gives the same tokens streamed and not, alone and inside a
  batch of eight, cold and then from the prefix cache (the garble check);
- ``tools``: with the recipe's ``--tool-call-parser`` and ``--enable-auto-tool-choice``, a
  battery of parts, each judged against the tool's schema: a required call, a named tool with
  nested arguments, parallel calls, a tool result fed back, a call cut by ``max_tokens`` (must
  say ``length``), ``tool_choice: none`` (text), and ``auto``, where the model decides and the
  parser must take its call out of the text;
- ``needle``: a fact hidden at several depths of prompts up to ``max_model_len`` (lengths
  measured with the server's tokenizer) comes back;
- ``reasoning``: with a ``--reasoning-parser``, reasoning and content come back apart;
- ``speculative``: with a speculative config, the draft acceptance rate from ``/metrics``
  (equal greedy output with and without drafts cannot be checked on one server);
- ``answers``: the answers themselves (``tandem.eval.answers``): against a good revision's
  reference (``--reference``), the likelihood of its answers, greedy agreement and the
  known-answer score, each judged against the noise the reference measured; without one, the
  known-answer score alone.

A check that cannot apply says so (``not-applicable``, the missing flag named); one whose
answer means nothing on this model says it cannot judge; neither passes silently. Results are
appended to ``smoke.jsonl`` as each check ends and the reports rewritten, so an interrupted run
resumes with the checks it has not finished.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tandem import files
from tandem.backends.state import GroupState
from tandem.endpoint import Endpoint
from tandem.errors import EndpointError
from tandem.eval import answers
from tandem.eval.answer_client import AnswerClient
from tandem.eval.outcome import NEAR_TIE, CheckResult, Outcome
from tandem.eval.reference import Reference, first_difference
from tandem.eval.toolschema import (
    PARAMETERS_OF,
    TRIP_TOOL,
    WEATHER_TOOL,
    schema_problems,
)
from tandem.jsonfiles import read_jsonl
from tandem.ownership import RunKind
from tandem.redact import public_url

RESULTS_FILE = "smoke.jsonl"
REPORT_JSON = "smoke.json"
REPORT_MD = "smoke.md"
RUN = RunKind(
    "eval smoke",
    "a smoke run",
    is_own=lambda folder: (folder / RESULTS_FILE).is_file() or (folder / REPORT_JSON).is_file(),
)
"""A smoke run's ``--out`` folder: identified by the server and model it checks (each check's
verdict stands alone, so a resumed run may give other lengths or parsers to the checks left)."""
GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 0}
BATCH = 8
NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
REQUEST_TIMEOUT_S = 300.0
"""The longest one request of a check may take, by default: a needle prompt of a long context
is prefilled within it on a real engine."""
PROGRESS_EVERY_S = 15.0
"""How often a check that waits for the server says so."""
NEEDLE_MARGIN_TOKENS = 64
"""Room left below ``max_model_len`` for the question and the answer."""
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


class SmokeTarget(BaseModel):
    """What is checked: the server, and what its recipe promises (from the deployment's state;
    with ``--url`` alone only what the flags say)."""

    url: str
    model: str
    max_model_len: int | None = None
    tool_call_parser: str | None = None
    auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    speculative: bool = False


def target_of(state: GroupState, model: str | None = None) -> SmokeTarget:
    """What a deployment's recipe promises, from its state."""
    serve = state.deployment(lenient=True).recipe.engine.serve
    return SmokeTarget(
        url=state.endpoint,
        model=model or state.model,
        max_model_len=serve.max_model_len,
        tool_call_parser=serve.tool_call_parser,
        auto_tool_choice=serve.enable_auto_tool_choice,
        reasoning_parser=serve.reasoning_parser,
        speculative=serve.speculative_config is not None,
    )


class SmokeReport(BaseModel):
    schema_version: int = 1
    url: str
    model: str
    started_at: datetime
    checks: list[CheckResult] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.outcome is not Outcome.FAIL for c in self.checks)


class Server:
    """The calls the checks make, with the model of ``target`` filled in, over one blocking
    ``tandem.endpoint.Endpoint`` (thread-safe, so a batch is eight threads on it): every
    answer is read there, a broken one raising the ``EndpointError`` that fails the check.

    ``timeout_s``: the longest one request may take (``eval smoke --request-timeout``).
    """

    def __init__(self, target: SmokeTarget, api_key: str | None, timeout_s: float) -> None:
        self.target = target
        self.url = target.url.rstrip("/")
        self.api_key, self.timeout_s = api_key, timeout_s
        self.endpoint = Endpoint(self.url, api_key=api_key, timeout_s=timeout_s)

    def close(self) -> None:
        self.endpoint.close()

    def chat(self, messages: list[dict], **params: Any) -> dict[str, Any]:
        return self.endpoint.chat(self.target.model, messages, **params)

    def chat_status(self, messages: list[dict], **params: Any) -> tuple[int, dict[str, Any]]:
        """A chat whose refusal is an answer too (a 400 for a flag the server lacks)."""
        return self.endpoint.chat_answer(self.target.model, messages, **params)

    def stream_steps(self, messages: list[dict], **params: Any) -> list[Step]:
        """A streamed chat's tokens with their log-probability margins (``logprobs`` asked)."""
        found: list[Step] = []
        for chunk in self.endpoint.stream_chat(self.target.model, messages, **params):
            for choice in chunk.get("choices") or []:
                found += steps_of((choice.get("logprobs") or {}).get("content") or [])
        return found

    def tokenize_chat(self, messages: list[dict]) -> list[int]:
        body = {"model": self.target.model, "messages": messages, "add_generation_prompt": True}
        return self.endpoint.tokenize(body)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        body = {"model": self.target.model, "prompt": text, "add_special_tokens": special}
        return self.endpoint.tokenize(body)

    def metrics(self) -> str:
        """The ``/metrics`` page; empty where the server has none (the check cannot judge)."""
        return self.endpoint.metrics_text() or ""


def _message(body: dict[str, Any]) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    choice = (body.get("choices") or [{}])[0]
    return choice.get("message") or {}, choice.get("finish_reason"), body.get("usage") or {}


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _not_applicable(check: str, missing: str) -> CheckResult:
    """A check the deployment's recipe does not promise: ``missing`` names what it lacks."""
    return CheckResult(check=check, outcome=Outcome.NOT_APPLICABLE, summary=missing)


def check_template(server: Server) -> CheckResult:
    messages = _ask("Name three colours.")
    evidence, failed = [], []
    ids = server.tokenize_chat(messages)
    prefix = server.tokenize("", special=True)
    if prefix and ids[: 2 * len(prefix)] == prefix * 2:
        failed.append(f"the special prefix {prefix} appears twice at the start (doubled BOS)")
    evidence.append(f"templated prompt: {len(ids)} tokens, special prefix {prefix or 'none'}")
    _, finish, usage = _message(server.chat(messages, max_tokens=1, **GREEDY))
    if usage.get("prompt_tokens") != len(ids):
        failed.append(
            f"the server counted {usage.get('prompt_tokens')} prompt tokens for the chat, its "
            f"tokenizer {len(ids)} for the templated prompt"
        )
    if finish != "length" or usage.get("completion_tokens") != 1:
        failed.append(
            f"max_tokens 1 gave finish_reason {finish!r} and "
            f"{usage.get('completion_tokens')} token(s), not 'length' and 1"
        )
    evidence.append(f"max_tokens 1: finish_reason {finish!r}, usage {usage}")
    message, finish, _ = _message(server.chat(messages, max_tokens=24, **GREEDY))
    free = message.get("content") or ""
    words = [w for w in free.split() if len(w) >= 3]
    if len(words) < 2:
        evidence.append(f"free answer {free!r}: too short to place a stop string")
    else:
        stop = words[len(words) // 2]
        cut = free[: free.index(stop)]
        message, finish, _ = _message(server.chat(messages, max_tokens=24, stop=[stop], **GREEDY))
        stopped = message.get("content") or ""
        evidence.append(f"stop {stop!r}: {stopped!r} finish_reason {finish!r}")
        if finish != "stop" or stopped != cut:
            failed.append(
                f"stop string {stop!r} gave {stopped!r} ({finish!r}), expected {cut!r} ('stop')"
            )
    verdict = partial(CheckResult, check="template", evidence=evidence)
    if failed:
        return verdict(outcome=Outcome.FAIL, summary="; ".join(failed))
    return verdict(
        outcome=Outcome.PASS,
        summary="one special prefix, prompt tokens as the tokenizer counts, length and stop "
        "honoured",
    )


class Step(BaseModel):
    """One generated token, and how far ahead of the runner-up it was (log-probability)."""

    token: str
    margin: float | None = None


def steps_of(logprobs: list[dict[str, Any]]) -> list[Step]:
    """The tokens of a response's ``logprobs.content``, each with its lead over the second
    most likely token."""
    steps = []
    for item in logprobs:
        top = sorted((t.get("logprob", 0.0) for t in item.get("top_logprobs") or []), reverse=True)
        steps.append(
            Step(token=item.get("token", ""), margin=top[0] - top[1] if len(top) > 1 else None)
        )
    return steps


def divergence(reference: list[Step], other: list[Step]) -> tuple[int, Step] | None:
    """Where ``other`` first leaves ``reference``: the index and the reference's step there."""
    at = first_difference([s.token for s in reference], [s.token for s in other])
    if at is None:
        return None
    return at, reference[at] if at < len(reference) else Step(token="")


def check_determinism(server: Server) -> CheckResult:
    """Greedy tokens cold, from the prefix cache, streamed and in a batch of eight.

    vLLM is not batch-invariant: another batch shape or a cached prefix changes the order of
    floating-point sums, which may flip a token whose runner-up was within ``NEAR_TIE`` of it
    (a random model has such ties everywhere). A path that leaves the cold tokens at such a near
    tie is reported, not failed; one that leaves them where the cold answer was sure is the
    garbling this check is for (and a real model's answer that changes meaning).
    """
    nonce = uuid.uuid4().hex[:8]  # a prompt no earlier request left in the prefix cache
    prompt = _ask(f"Session {nonce}. " + FILLER * 8 + "Continue the story of the green grass.")
    params = {"max_tokens": 32, "logprobs": True, "top_logprobs": 2, **GREEDY}

    def steps(body: dict[str, Any]) -> list[Step]:
        choice = (body.get("choices") or [{}])[0]
        return steps_of((choice.get("logprobs") or {}).get("content") or [])

    cold = steps(server.chat(prompt, **params))
    runs = {"from the prefix cache": steps(server.chat(prompt, **params))}
    runs["streamed"] = server.stream_steps(prompt, **params)
    others = [_ask(f"Tell me fact number {i} about rivers.") for i in range(BATCH - 1)]
    with ThreadPoolExecutor(BATCH) as pool:
        futures = [pool.submit(server.chat, m, **params) for m in [prompt, *others]]
        runs["in a batch of 8"] = steps(futures[0].result())
    evidence = [f"cold: {''.join(s.token for s in cold)!r}"]
    garbled: list[str] = []
    near: list[str] = []
    for path, run in runs.items():
        evidence.append(f"{path}: {''.join(s.token for s in run)!r}")
        split = divergence(cold, run)
        if split is None:
            continue
        index, margin = split[0], split[1].margin
        led = f" (cold led by {margin:.4f})" if margin is not None else ""
        said = f"{path} at token {index}{led}"
        (near if margin is not None and margin < NEAR_TIE else garbled).append(said)
    verdict = partial(CheckResult, check="determinism", evidence=evidence)
    if not cold:
        return verdict(
            outcome=Outcome.FAIL, summary="the server returned no token log-probabilities"
        )
    if garbled:
        return verdict(
            outcome=Outcome.FAIL,
            summary="greedy output changed where the cold answer was sure: " + "; ".join(garbled),
        )
    return verdict(
        outcome=Outcome.PASS,
        summary="the same greedy tokens cold, cached, streamed and in a batch of 8"
        + (
            f", except at near ties (batch-variance, not garble): {'; '.join(near)}" if near else ""
        ),
    )


def _arguments_problems(calls: list[dict[str, Any]]) -> list[str]:
    """Each call names a tool that was offered and its arguments match that tool's schema."""
    found = []
    for call in calls:
        function = call.get("function") or {}
        name = function.get("name")
        schema = PARAMETERS_OF.get(name or "")
        if schema is None:
            found.append(f"called {name!r}, which was not offered")
            continue
        found += [f"{name}: {p}" for p in schema_problems(function.get("arguments") or "", schema)]
    return found


def _looks_like_a_call(text: str) -> bool:
    """Text that carries a call of the offered tool (its name beside a JSON object): what a
    model wrote when the server's parser did not take it out as a call."""
    return "get_weather" in text and "{" in text


class ToolPart(BaseModel):
    """One part of the tool battery: its outcome (pass, fail or cannot-judge) and what came
    back."""

    part: str
    outcome: Outcome
    said: str


@dataclass
class _ToolAnswer:
    """One greedy request of the battery as its parts read it, a refusal included."""

    status: int
    body: dict[str, Any]
    message: dict[str, Any]
    finish: str | None
    calls: list[dict[str, Any]]

    @property
    def said(self) -> str:
        """The evidence line of a part that asked for a call."""
        return f"HTTP {self.status}, finish {self.finish!r}, calls {_calls_text(self.calls)}"

    @property
    def refused(self) -> list[str]:
        """What a part fails on when the server refused its request (none when it answered)."""
        return [] if self.status == 200 else [f"HTTP {self.status}"]


def _tool_parts(server: Server) -> list[ToolPart]:
    """The battery, each part one request or two (parts need no meaning unless they say so)."""
    weather = _ask("What is the weather in Paris? Use the tool.")
    parts: list[ToolPart] = []

    def ask(messages: list[dict], **params: Any) -> _ToolAnswer:
        status, body = server.chat_status(messages, **params, **GREEDY)
        message, finish, _ = _message(body)
        return _ToolAnswer(status, body, message, finish, message.get("tool_calls") or [])

    def part(name: str, failed: list[str], said: str, *, cannot_judge: str = "") -> None:
        outcome = Outcome.FAIL if failed else Outcome.CANNOT_JUDGE if cannot_judge else Outcome.PASS
        detail = "; ".join(failed) or cannot_judge
        parts.append(
            ToolPart(part=name, outcome=outcome, said=said + (f": {detail}" if detail else ""))
        )

    def forced(name: str, got: _ToolAnswer, problems: list[str]) -> None:
        """A call the request forced: a refusal or a wrong call fails; one that ran out of
        ``max_tokens`` before it closed says so (a small model may repeat a list forever)."""
        if got.status == 200 and got.finish == "length" and problems:
            part(name, [], got.said, cannot_judge="the call ran past max_tokens before it closed")
        else:
            part(name, got.refused or problems, got.said)

    # required: the server must return a call (its structured output forces one)
    got = ask(weather, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=128)
    calls = got.calls
    forced("required", got, _arguments_problems(calls) or ([] if calls else ["no tool call"]))

    # a named tool with nested arguments: an object in the object, an array of strings
    got = ask(
        _ask("Book a trip to Rome and Oslo for Ada, who is 36."),
        tools=[WEATHER_TOOL, TRIP_TOOL],
        tool_choice={"type": "function", "function": {"name": "book_trip"}},
        max_tokens=160,
    )
    named = [c.get("function", {}).get("name") for c in got.calls] == ["book_trip"]
    problems = [] if named else ["not exactly one call of book_trip"]
    forced("named with nested arguments", got, _arguments_problems(got.calls) + problems)

    # parallel calls: two cities, one call each; a small model may make one (it cannot judge)
    got = ask(
        _ask("What is the weather in Paris and in Tokyo? Call the tool once for each city."),
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=200,
    )
    calls = got.calls
    ids = {c.get("id") for c in calls}
    problems = _arguments_problems(calls) + (
        [] if len(ids) == len(calls) else ["two calls share an id"]
    )
    part(
        "parallel",
        got.refused or problems,
        f"HTTP {got.status}, calls {_calls_text(calls)}",
        cannot_judge="" if len(calls) >= 2 else f"{len(calls)} call(s) where two were asked",
    )

    # a tool result fed back: the template must render the call and the result
    call_id = "call_smoke_1"
    history = [
        *weather,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": '{"temperature_c": 21, "sky": "clear"}',
        },
    ]
    got = ask(history, tools=[WEATHER_TOOL], max_tokens=48)
    status, body, answer = got.status, got.body, got.message.get("content") or ""
    part(
        "tool result fed back",
        [] if status == 200 else [f"HTTP {status}: {str(body.get('error') or body)[:200]}"],
        f"HTTP {status}, answer {answer[:120]!r}",
        cannot_judge="" if "21" in answer else "the answer does not use the result (21)",
    )

    # a call cut by max_tokens: it must say 'length', never hand out a call as complete
    got = ask(weather, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=4)
    part(
        "cut by max_tokens",
        []
        if got.status == 200 and got.finish == "length"
        else [f"HTTP {got.status}, finish {got.finish!r} where max_tokens cut the call ('length')"],
        got.said,
    )

    # tool_choice none: text, no call
    got = ask(weather, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=16)
    called = ["a tool was still called"] if got.calls else []
    part("none", got.refused or called, f"HTTP {got.status}, calls {_calls_text(got.calls)}")

    # auto: the model decides and the server's parser takes the call out of its text
    got = ask(weather, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=128)
    calls, text = got.calls, got.message.get("content") or ""
    failed = got.refused or _arguments_problems(calls)
    if got.status == 200 and not calls and _looks_like_a_call(text):
        failed.append(
            f"the model wrote a call that --tool-call-parser {server.target.tool_call_parser} "
            "did not take out of the text: is it this model's parser?"
        )
    part(
        "auto (the parser)",
        failed,
        f"{got.said}, text {text[:120]!r}",
        cannot_judge="" if calls else "the model answered in text, calling nothing",
    )
    return parts


def _calls_text(calls: list[dict[str, Any]]) -> str:
    shown = [
        f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
        for c in calls
    ]
    return "[" + ", ".join(shown) + "]"


def check_tools(server: Server) -> CheckResult:
    """Fails on any part that fails; passes when none fails and one passes, naming the parts
    it could not judge on this model (a small model may not call tools unprompted)."""
    target = server.target
    if not (target.tool_call_parser and target.auto_tool_choice):
        return _not_applicable(
            "tools", "the deployment has no --tool-call-parser with --enable-auto-tool-choice"
        )
    parts = _tool_parts(server)
    evidence = [f"{p.part} [{p.outcome}]: {p.said}" for p in parts]
    failed = [p for p in parts if p.outcome is Outcome.FAIL]
    unjudged = [p.part for p in parts if p.outcome is Outcome.CANNOT_JUDGE]
    passed = [p.part for p in parts if p.outcome is Outcome.PASS]
    if failed:
        outcome = Outcome.FAIL
        summary = "; ".join(f"{p.part}: {p.said}" for p in failed)
    elif passed:
        outcome = Outcome.PASS
        summary = f"{len(passed)} of {len(parts)} parts pass ({', '.join(passed)})" + (
            f"; cannot judge on this model: {', '.join(unjudged)}" if unjudged else ""
        )
    else:
        outcome = Outcome.CANNOT_JUDGE
        summary = "no part could be judged: " + ", ".join(unjudged)
    return CheckResult(check="tools", outcome=outcome, summary=summary, evidence=evidence)


def needle_lengths(max_model_len: int) -> list[int]:
    """Prompt lengths for the needle grid: a quarter, half and nearly all of the context."""
    top = max_model_len - NEEDLE_MARGIN_TOKENS
    return sorted({max(64, top // 4), max(64, top // 2), max(64, top)})


def check_needle(server: Server, lengths: list[int] | None = None) -> CheckResult:
    if not lengths:
        if not server.target.max_model_len:
            return _not_applicable("needle", "max_model_len unknown: give --needle-lengths")
        lengths = needle_lengths(server.target.max_model_len)
    beyond = [n for n in lengths if server.target.max_model_len and n > server.target.max_model_len]
    if beyond:
        return CheckResult(
            check="needle",
            outcome=Outcome.FAIL,
            summary=f"prompts of {', '.join(map(str, beyond))} tokens do not fit the server's "
            f"max_model_len {server.target.max_model_len}",
        )
    code = f"{uuid.uuid4().int % 90000 + 10000}"
    needle = f" The secret number is {code}. "
    question = " What is the secret number? Answer with the number only."
    per_filler = max(1, len(server.tokenize(FILLER, special=False)))

    def haystack(repeats: int, depth: float) -> list[dict]:
        before = int(repeats * depth)
        return _ask(FILLER * before + needle + FILLER * (repeats - before) + question)

    overhead = len(server.tokenize_chat(haystack(0, 0.0)))
    misses, evidence = [], []
    for length in lengths:
        for depth in NEEDLE_DEPTHS:
            # sized by the server's own count: the first guess, then down until it fits
            repeats = max(0, (length - overhead) // per_filler)
            messages = haystack(repeats, depth)
            while (size := len(server.tokenize_chat(messages))) > length and repeats > 0:
                repeats -= max(1, (size - length) // per_filler)
                messages = haystack(max(0, repeats), depth)
            answer = (
                _message(server.chat(messages, max_tokens=12, **GREEDY))[0].get("content") or ""
            )
            found = code in answer
            evidence.append(
                f"{size} tokens, depth {depth:.0%}: {answer.strip()[:40]!r} "
                f"{'found' if found else 'missed'}"
            )
            if not found:
                misses.append(f"{size}/{depth:.0%}")
    verdict = partial(CheckResult, check="needle", evidence=evidence)
    if misses:
        return verdict(
            outcome=Outcome.FAIL,
            summary=f"the number was missed at {len(misses)} of "
            f"{len(lengths) * len(NEEDLE_DEPTHS)} (tokens/depth): {', '.join(misses)}",
        )
    return verdict(
        outcome=Outcome.PASS,
        summary=f"found at every depth of {len(lengths)} lengths up to {max(lengths)} tokens",
    )


def check_reasoning(server: Server) -> CheckResult:
    if not server.target.reasoning_parser:
        return _not_applicable("reasoning", "the deployment has no --reasoning-parser")
    message, finish, _ = _message(server.chat(_ask("What is 17 + 25?"), max_tokens=256, **GREEDY))
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    content = message.get("content") or ""
    evidence = [f"reasoning {reasoning[:80]!r}", f"content {content[:80]!r}", f"finish {finish!r}"]
    verdict = partial(CheckResult, check="reasoning", evidence=evidence)
    if "<think>" in content or "</think>" in content:
        return verdict(outcome=Outcome.FAIL, summary="think tags left in the content")
    if not reasoning:
        return verdict(outcome=Outcome.FAIL, summary="no reasoning field in the message")
    if not content.strip():
        # A model that never thinks, under a parser that calls all text before an end of
        # thinking reasoning, answers nothing a client shows (seen: SmolLM2 under qwen3).
        return verdict(
            outcome=Outcome.CANNOT_JUDGE if finish == "length" else Outcome.FAIL,
            summary="max_tokens ended the answer while it was still reasoning"
            if finish == "length"
            else "the whole answer came back as reasoning and the content is empty: the "
            f"parser found no end of thinking (is --reasoning-parser "
            f"{server.target.reasoning_parser} this model's?)",
        )
    return verdict(outcome=Outcome.PASS, summary="reasoning and content apart")


def check_speculative(server: Server) -> CheckResult:
    if not server.target.speculative:
        return _not_applicable("speculative", "the deployment has no speculative config")
    server.chat(_ask("Count from one to twenty."), max_tokens=64, **GREEDY)
    totals: dict[str, float] = {}
    for line in server.metrics().splitlines():
        for name in ("spec_decode_num_accepted_tokens", "spec_decode_num_draft_tokens"):
            if line.startswith(f"vllm:{name}_total"):
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    drafts = totals.get("spec_decode_num_draft_tokens", 0.0)
    verdict = partial(CheckResult, check="speculative")
    if not drafts:
        return verdict(outcome=Outcome.CANNOT_JUDGE, summary="/metrics counted no draft tokens")
    rate = totals.get("spec_decode_num_accepted_tokens", 0.0) / drafts
    return verdict(
        outcome=Outcome.INFO,
        summary=f"draft acceptance {rate:.1%} of {drafts:.0f} draft tokens",
        evidence=[f"{k}: {v:.0f}" for k, v in totals.items()],
    )


def check_answers(server: Server, reference: Reference | None = None) -> CheckResult:
    """``answers``: the server against a good revision's ``reference``; without one, the
    shipped known-answer set alone."""
    with AnswerClient(
        server.url, server.target.model, api_key=server.api_key, timeout_s=server.timeout_s
    ) as client:
        return answers.check_answers(client, reference).check_result()


CHECKS: dict[str, Callable[[Server], CheckResult]] = {
    "template": check_template,
    "determinism": check_determinism,
    "tools": check_tools,
    "needle": check_needle,
    "reasoning": check_reasoning,
    "speculative": check_speculative,
    "answers": check_answers,
}


def markdown(report: SmokeReport) -> str:
    """The report as Markdown: one row a check, then each check's evidence."""
    lines = [
        f"# Smoke checks of {report.model}",
        "",
        f"{public_url(report.url)}, started {report.started_at:%Y-%m-%d %H:%M:%S} UTC: "
        + ("**PASS**" if report.ok else "**FAIL**"),
        "",
        "| check | outcome | seconds | summary |",
        "|---|---|---:|---|",
    ]
    lines += [
        f"| {c.check} | {c.outcome.value} | {c.seconds:.1f} | {c.summary.replace('|', '/')} |"
        for c in report.checks
    ]
    for c in report.checks:
        if c.evidence:
            lines += ["", f"## {c.check}", "", *(f"- `{e}`" for e in c.evidence)]
    return "\n".join(lines) + "\n"


class SmokeRun(BaseModel):
    """What one smoke run checks, and how: the checks (default: all), the needle's prompt
    lengths, ``resume`` (the checks already in the folder are kept and not run again),
    ``first_failure`` (an upgrade's gate: a broken revision is rolled back without waiting for
    the checks that cannot save it) and the longest one request may take."""

    checks: list[str] | None = None
    needle: list[int] | None = None
    resume: bool = False
    first_failure: bool = False
    timeout_s: float = REQUEST_TIMEOUT_S
    reference: Reference | None = Field(
        default=None,
        description="The good revision's answers the ``answers`` check holds the server to "
        "(without one it scores the known answers alone).",
    )


def run_smoke(
    target: SmokeTarget,
    out_dir: Path,
    run: SmokeRun | None = None,
    *,
    api_key: str | None = None,
    on_result: Callable[[CheckResult], None] = lambda result: None,
    on_progress: Callable[[str], None] = lambda text: None,
) -> SmokeReport:
    """Run ``run``'s checks against ``target``; each result is appended to
    ``out_dir/smoke.jsonl`` as it ends and the reports rewritten. A request that takes longer
    than ``run.timeout_s`` fails its check. ``on_progress`` hears when a check starts, and
    every ``PROGRESS_EVERY_S`` while it waits for the server (a server that hangs is not
    silence for minutes).

    Raises:
        EndpointError: the server stopped answering (what finished is kept for ``--resume``).
    """
    run = run or SmokeRun()
    results = out_dir / RESULTS_FILE
    done: list[CheckResult] = []
    if run.resume and results.exists():
        files.cut_torn_line(results)  # a check killed mid-line runs again
        done = read_jsonl(
            results, CheckResult.model_validate, what="smoke result", hint="start a new --out"
        ).records
    elif results.exists():
        results.unlink()  # a folder tandem marked as its own: a new run starts its file anew
    report = SmokeReport(
        url=public_url(target.url), model=target.model, started_at=datetime.now(UTC), checks=done
    )
    finished = {c.check for c in done}
    server = Server(target, api_key, run.timeout_s)
    runners: dict[str, Callable[[Server], CheckResult]] = {
        **CHECKS,
        "needle": lambda s: check_needle(s, run.needle),
        "answers": lambda s: check_answers(s, run.reference),
    }
    try:
        with files.LineLog(results) as log:
            for name in run.checks or list(CHECKS):
                if name in finished:
                    continue
                started = time.monotonic()
                on_progress(f"{name}: running")
                try:
                    with _waiting(name, run.timeout_s, PROGRESS_EVERY_S, on_progress):
                        result = runners[name](server)
                except EndpointError as exc:  # a refusal or a broken answer is the verdict
                    result = CheckResult(
                        check=name,
                        outcome=Outcome.FAIL,
                        summary=f"the server broke the check: {exc.message}",
                        evidence=[exc.message],
                    )
                result.seconds = round(time.monotonic() - started, 2)
                log.write_json(result)
                report.checks.append(result)
                _write_reports(report, out_dir)
                on_result(result)
                if run.first_failure and result.outcome is Outcome.FAIL:
                    break
    finally:
        server.close()
    _write_reports(report, out_dir)
    return report


@contextmanager
def _waiting(
    check: str, timeout_s: float, every_s: float, say: Callable[[str], None]
) -> Iterator[None]:
    """While a check runs: a line every ``every_s`` seconds saying how long it has waited."""
    done = threading.Event()

    def tell() -> None:
        started = time.monotonic()
        while not done.wait(every_s):
            say(
                f"{check}: still waiting for the server after "
                f"{time.monotonic() - started:.0f} s (a request may take up to "
                f"{timeout_s:g} s: --request-timeout)"
            )

    thread = threading.Thread(target=tell, name="smoke-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _write_reports(report: SmokeReport, out_dir: Path) -> None:
    files.write_json(out_dir / REPORT_JSON, report)
    files.write_text(out_dir / REPORT_MD, markdown(report))
