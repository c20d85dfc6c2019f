"""The public names of tandem are decided once, here."""

from pathlib import Path

import tandem
import tandem.bench
import tandem.eval


def public_names(module) -> list[str]:
    return sorted(
        n
        for n in vars(module)
        if not n.startswith("_") and not isinstance(vars(module)[n], type(tandem))
    )


def test_all_is_sorted_and_complete():
    for module in (tandem, tandem.bench, tandem.eval):
        assert module.__all__ == sorted(module.__all__), module.__name__
        assert sorted(module.__all__) == public_names(module), module.__name__


def test_docstring_usage_runs():
    examples = Path(__file__).resolve().parents[1] / "examples"
    deployment = tandem.load_deployment("deepseek-v4-flash", examples / "dgx-spark-pair.yaml")
    plan = tandem.plan_ranks(deployment)
    assert [r.node for r in plan.ranks] == ["spark-a", "spark-b"]
