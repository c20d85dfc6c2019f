"""Where each target puts a rank's compile caches, and `down --purge-caches` on a deployment
that is already down (the real CLI on real folders; the engine runs are in
tests/test_caches_engine.py and tests/test_ssh_engine.py)."""

from __future__ import annotations

from pathlib import Path

from factories import make_deployment

from tandem import caches
from tandem.backends.runtimes import VenvRuntime
from tandem.rankplan import plan_ranks


def test_purge_of_a_stopped_deployment_removes_every_ranks_root(tmp_path: Path, tandem_here):
    for rank in (0, 1):
        folder = caches.local_root(tmp_path, "tiny-local", rank) / "vllm" / "modelinfos"
        folder.mkdir(parents=True)
        (folder / "m.json").write_text("{}")
    other = caches.local_root(tmp_path, "other", 0)
    other.mkdir(parents=True)
    result = tandem_here("down", "tiny-local", "--purge-caches", TANDEM_HOME=str(tmp_path))
    assert result.code == 0, result.err
    assert "removed the compile caches" in result.out
    assert not (tmp_path / "caches" / "tiny-local").exists() and other.is_dir()


def test_the_venv_runtime_points_every_cache_variable_at_the_ranks_root_and_keeps_it():
    deployment = make_deployment()
    runtime = VenvRuntime(deployment.cluster.ssh)
    rank = plan_ranks(deployment).ranks[1]
    root = f"{deployment.cluster.ssh.remote_dir}/{deployment.name}/caches/rank1"
    start = runtime.start_script(rank, deployment)
    for var, folder in caches.CACHE_DIRS.items():
        assert f"export {var}={root}/{folder}\n" in start
    stop = runtime.stop_script(deployment.name, 1)
    assert "caches" not in stop and "vllm-cache" not in stop
