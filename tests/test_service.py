"""``tandem service``: the unit it writes passes the real ``systemd-analyze verify``, holds no
secret, and, where systemd is the init system, installs, starts and uninstalls for real."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from tandem_cli import run_tandem

from tandem.backends import systemd
from tandem.errors import BackendError
from tandem.render.systemd import ServiceSpec, render_unit

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze is not installed (.ci/run installs Debian's systemd package)",
)


def tandem_at(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    return run_tandem(*args, env={**os.environ, "TANDEM_HOME": str(home), **env}, check=False)


def verify(unit: Path) -> subprocess.CompletedProcess:
    """``systemd-analyze verify``: exit 0 and not a line of complaint about this unit."""
    return subprocess.run(
        [ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


@needs_analyze
def test_the_installed_unit_passes_systemd_analyze_verify(tmp_path: Path, tandem_here):
    result = tandem_here(
        "service",
        "install",
        "tiny-local",
        "--no-enable",
        "--unit-dir",
        str(tmp_path),
        TANDEM_HOME=str(tmp_path / "home"),
        VLLM_API_KEY="sk-unit-secret",
    )
    assert result.code == 0, result.err
    unit = tmp_path / "tandem-tiny-local.service"
    checked = verify(unit)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stderr
    text = unit.read_text()
    assert "After=network-online.target" in text and "Restart=on-failure" in text
    program = systemd.tandem_program()
    assert f"ExecStart={program} up tiny-local --supervise" in text
    assert f'Environment="TANDEM_HOME={tmp_path / "home"}"' in text
    assert "EnvironmentFile=-/etc/tandem/tiny-local.env" in text
    assert "sk-unit-secret" not in text


@needs_analyze
def test_verify_rejects_a_unit_whose_program_is_missing(tmp_path: Path):
    # The check above can fail: the same verify on a unit that cannot start.
    spec = ServiceSpec(
        deployment="tiny-local", tandem=["/nonexistent/tandem"], recipe="tiny-local", cluster=None
    )
    unit = tmp_path / "tandem-tiny-local.service"
    unit.write_text(render_unit(spec))
    checked = verify(unit)
    assert checked.returncode != 0 and "/nonexistent/tandem" in checked.stderr


def test_a_secret_never_goes_into_the_unit_but_into_a_root_only_file(tmp_path: Path):
    spec = systemd.spec_for("tiny-local", "tiny-local", None)
    with pytest.raises(ValueError, match="VLLM_API_KEY"):
        render_unit(dataclasses.replace(spec, environment={"VLLM_API_KEY": "sk-x"}))
    env_path = tmp_path / "etc" / "tiny-local.env"
    unit, written = systemd.install(
        spec,
        unit_dir=tmp_path,
        enable=False,
        secrets={"VLLM_API_KEY": "sk-x", "OTHER": "no"},
        env_path=env_path,
    )
    assert written == env_path and "VLLM_API_KEY=sk-x\n" in env_path.read_text()
    assert "OTHER" not in env_path.read_text()
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
    assert "sk-x" not in unit.read_text()
    assert systemd.uninstall("tiny-local", unit_dir=tmp_path, env_path=env_path) == [unit, env_path]


def test_a_cluster_file_and_a_recipe_file_are_named_by_absolute_path(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = systemd.spec_for("tiny-ssh", "recipes/tiny-ssh.yaml", "pair.yaml", ["--timeout", "60"])
    text = render_unit(spec)
    assert (
        f"up {tmp_path}/recipes/tiny-ssh.yaml --cluster {tmp_path}/pair.yaml --timeout 60 "
        "--supervise"
    ) in text
    assert f"ExecStop={systemd.tandem_program()} down tiny-ssh" in text


@pytest.mark.skipif(systemd.systemd_running(), reason="systemd is the init system here")
def test_without_systemd_enabling_is_refused_with_the_way_out(tmp_path: Path, tandem_here):
    home = str(tmp_path / "home")
    result = tandem_here(
        "service", "install", "tiny-local", "--unit-dir", str(tmp_path), TANDEM_HOME=home
    )
    assert result.code == 2
    assert "systemd is not the init system" in result.err and "--no-enable" in result.err
    assert not (tmp_path / "tandem-tiny-local.service").exists()
    status = json.loads(
        tandem_here(
            "service",
            "status",
            "tiny-local",
            "--unit-dir",
            str(tmp_path),
            "--json",
            TANDEM_HOME=home,
        ).out
    )
    assert status["installed"] is False and status["systemd"] is False


@pytest.mark.skipif(
    not systemd.systemd_running(),
    reason="systemd is not PID 1 here (PID 1: "
    f"'{systemd.init_process()}'), so no unit can be started",
)
@pytest.mark.skipif(os.geteuid() != 0, reason="installing a system unit needs root")
def test_install_start_and_uninstall_under_systemd(tmp_path: Path):
    # A deployment that fails fast (no model), so starting it costs no engine boot: the unit is
    # loaded, enabled and started by systemd, and uninstall leaves nothing behind.
    home = tmp_path / "home"
    result = tandem_at(
        "service", "install", "tiny-local", "--start", home=home, HF_HOME=str(tmp_path / "empty-hf")
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(tandem_at("service", "status", "tiny-local", "--json", home=home).stdout)
    assert status["installed"] and status["properties"]["UnitFileState"] == "enabled"
    assert status["properties"]["LoadState"] == "loaded"
    assert status["properties"]["ActiveState"] in ("active", "activating")
    removed = tandem_at("service", "uninstall", "tiny-local", home=home)
    assert removed.returncode == 0 and "tandem-tiny-local.service" in removed.stdout
    assert not Path("/etc/systemd/system/tandem-tiny-local.service").exists()


def test_an_unwritable_secrets_folder_writes_nothing(tmp_path: Path):
    blocker = tmp_path / "etc"
    blocker.write_text("a file where /etc/tandem's parent should be")
    units = tmp_path / "units"
    spec = systemd.spec_for("tiny-local", "tiny-local", None)
    with pytest.raises(BackendError) as caught:
        systemd.install(
            spec,
            unit_dir=units,
            enable=False,
            secrets={"VLLM_API_KEY": "sk-x"},
            env_path=blocker / "tandem" / "tiny-local.env",
        )
    assert caught.value.file == str(blocker / "tandem" / "tiny-local.env")
    assert f"{blocker} is a file" in caught.value.message and "sudo" in caught.value.hint
    assert not units.exists(), "the unit must not be written before the secrets file can be"


def test_an_unwritable_unit_folder_is_one_message(tmp_path: Path, tandem_here):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = tandem_here(
        "service",
        "install",
        "tiny-local",
        "--no-enable",
        "--unit-dir",
        str(blocker / "units"),
        TANDEM_HOME=str(tmp_path / "home"),
    )
    assert result.code == 2 and "Traceback" not in result.err
    assert "cannot be written" in result.err and "--unit-dir" in result.err
