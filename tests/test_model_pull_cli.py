"""`tandem model pull` says what it would do and where it does not apply (newcomer review,
defect 10): a dry run, this machine's cluster (one download into its cache), Kubernetes (where
the weights must be), a model tandem builds (never a download)."""

from __future__ import annotations


def test_a_dry_run_on_this_machine_names_the_download(tandem_here, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = tandem_here("model", "pull", "deepseek-v4-flash", "--dry-run")
    assert result.code == 0, result.err
    assert "would download deepseek-ai/DeepSeek-V4-Flash@main into" in result.out
    assert not (tmp_path / "hf").exists()


def test_a_model_tandem_builds_is_built_not_pulled(tandem_here):
    result = tandem_here("model", "pull", "smollm2-local", "--dry-run")
    assert result.code == 2
    assert "`tandem model real`" in result.err and "no hub has it" in result.err


def test_kubernetes_says_where_the_weights_must_be(tandem_here):
    result = tandem_here(
        "model", "pull", "deepseek-v4-flash-dspark", "--cluster", "examples/dgx-spark-eks.yaml"
    )
    assert result.code == 2
    assert "hostPath" in result.err and "/root/.cache/huggingface" in result.err
