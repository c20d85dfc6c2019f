"""One home for the Hugging Face cache layout (``tandem.hf_cache``), and the node probe's
stdlib copy of it held to the same layout."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from tandem import agent, hf_cache
from tandem.plan.config import default_cache_roots, hf_cache_snapshot

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached(home: Path, repo_id: str) -> Path:
    """A one-file snapshot of ``repo_id`` at ``main`` in the layout ``tandem.hf_cache`` names."""
    repo = hf_cache.repo_dir(home, repo_id)
    snapshot = hf_cache.snapshot_dir(repo, COMMIT)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    hf_cache.ref_file(repo, "main").parent.mkdir(parents=True)
    hf_cache.ref_file(repo, "main").write_text(COMMIT)
    return snapshot


def test_the_layout_is_huggingface_hubs():
    home = PurePosixPath("~/.cache/huggingface")
    repo = hf_cache.repo_dir(home, "deepseek-ai/DeepSeek-V4-Flash")
    assert str(repo) == "~/.cache/huggingface/hub/models--deepseek-ai--DeepSeek-V4-Flash"
    assert str(hf_cache.snapshot_dir(repo, "c0")).endswith("/snapshots/c0")
    assert str(hf_cache.ref_file(repo, "main")).endswith("/refs/main")


def test_the_local_home_is_hf_home_else_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hf_cache.local_home() == tmp_path
    monkeypatch.delenv("HF_HOME")
    assert hf_cache.local_home() == Path(hf_cache.DEFAULT_HOME).expanduser()
    assert default_cache_roots()[-1] == hf_cache.local_home()


def test_the_planner_and_the_probe_find_what_the_layout_names(tmp_path):
    snapshot = cached(tmp_path / "hf", "org/model")
    assert hf_cache_snapshot("org/model", "main", [tmp_path / "hf"]) == snapshot
    facts = agent.model_facts(
        agent.Node(root=str(tmp_path), commands=str(tmp_path)),
        "org/model",
        "main",
        "/hf",
        None,
        False,
    )
    assert facts["layout"] == "hf-cache" and facts["commit"] == COMMIT
    assert facts["snapshot_dir"] == "/hf/hub/models--org--model/snapshots/" + COMMIT
