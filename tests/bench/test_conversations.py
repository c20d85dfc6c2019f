"""What the load generator sends for each workload, seen from a stub server that keeps every
request body: multi-turn history, shared prefixes, rounds and a prompt file's sampled rows.
(The engine tests hold the same workloads against a real server's token counts.)"""

from __future__ import annotations

import asyncio

from openai_stub import STREAM, openai_stub

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import LoadGenerator, read_records
from tandem.bench.timed_request import ENDPOINTS, StreamAccumulator
from tandem.report.bench import write_plots

from .conftest import FIXTURES


def run(url: str, tmp_path, **settings):  # type: ignore[no-untyped-def]
    config = BenchConfig(
        url=url,
        output_tokens=4,
        warmup_requests=0,
        scrape_metrics=False,
        concurrency=[1],
        **settings,
    )
    return asyncio.run(LoadGenerator(config, tmp_path / "out").arun())


def recorded_answer() -> str:
    pieces: list[str] = []
    StreamAccumulator(ENDPOINTS["chat"], pieces).feed(STREAM, 0.0)
    return "".join(pieces)


def test_each_turn_carries_the_earlier_turns_and_the_servers_answers(tmp_path):
    with openai_stub() as stub:
        result = run(stub.url, tmp_path, requests=2, input_tokens=6, turns=3)
    answer = recorded_answer()
    assert answer.strip()
    first, second, third = (body["messages"] for body in stub.bodies[:3])
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[:3] == [*second, {"role": "assistant", "content": answer}][:3]
    assert second[0] == first[0] and second[1] == {"role": "assistant", "content": answer}
    assert len({first[0]["content"], second[2]["content"], third[4]["content"]}) == 3
    turns = result.points[0].metrics.turns
    assert [(t.turn, t.requests) for t in turns] == [(1, 2), (2, 2), (3, 2)]
    assert len(stub.bodies) == 6


def test_groups_share_their_prefix_and_points_and_rounds_draw_new_ones(tmp_path):
    with openai_stub() as stub:
        result = run(
            stub.url,
            tmp_path,
            requests=4,
            input_tokens=6,
            prefix_tokens=5,
            prefix_groups=2,
            rounds=2,
        )
    assert [(p.point.label, p.point.round) for p in result.points] == [("c1", 1), ("c1", 2)]
    systems = [body["messages"][0]["content"] for body in stub.bodies]
    users = [body["messages"][1]["content"] for body in stub.bodies]
    assert [body["messages"][0]["role"] for body in stub.bodies] == ["system"] * 8
    assert systems[0] == systems[2] != systems[1] == systems[3]  # round 1: two groups
    assert not set(systems[:4]) & set(systems[4:])  # round 2: prefixes of its own
    assert len(set(users)) == 8  # every request's own part differs


def test_a_prompt_file_is_sampled_in_the_seeds_order(tmp_path):
    path = FIXTURES / "datasets" / "sharegpt.json"

    def users(seed: int) -> list[str]:
        runs = len(list(tmp_path.iterdir()))
        with openai_stub() as stub:
            result = run(
                stub.url, tmp_path / str(runs), prompt_file=str(path), requests=4, seed=seed
            )
        assert result.dataset is not None and result.dataset.distinct == 4
        return [body["messages"][-1]["content"] for body in stub.bodies]

    first = users(1)
    assert sorted(first) == sorted(
        [
            "Name three rivers of Europe.",
            "Why is the sky blue?",
            "Write a haiku about a harbor at dawn.",
            "What does a compiler do?",
        ]
    )
    assert users(1) == first and users(2) != first


def test_every_request_of_a_depth_point_carries_a_context_of_its_own(tmp_path):
    """The depth sweep: depth by depth, each request's system message is its own context of
    that many words (this stub has no /tokenize: a word a token), so no cache can serve it."""
    with openai_stub() as stub:
        result = run(stub.url, tmp_path, requests=2, input_tokens=6, depths=[0, 40])
    assert [p.point.label for p in result.points] == ["c1-d0", "c1-d40"]
    assert [p.point.depth_tokens for p in result.points] == [0, 40]
    shallow, deep = stub.bodies[:2], stub.bodies[2:]
    assert all([m["role"] for m in b["messages"]] == ["user"] for b in shallow)
    contexts = [b["messages"][0]["content"] for b in deep]
    assert [b["messages"][0]["role"] for b in deep] == ["system", "system"]
    assert [len(c.split()) for c in contexts] == [40, 40] and contexts[0] != contexts[1]
    records = read_records(tmp_path / "out" / "requests.jsonl").records
    drawn = {path.name for path in write_plots(result, records, tmp_path / "plots")}
    assert "speed_vs_depth.png" in drawn and "latency_vs_concurrency.png" in drawn
