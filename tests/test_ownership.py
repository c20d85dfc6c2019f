"""tandem deletes, overwrites and kills only what it owns (``tandem.ownership``).

Each destructive command is run as a user would, with a name or a path aimed outside tandem's
own folders (``..``, an absolute name, a link planted inside), beside a folder of the user's
that must come through untouched; then a property test throws arbitrary names and output paths
at the same commands and checks that nothing outside the state root and the folder it was told
to create changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from factories import launched_local_state
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem import ownership
from tandem.backends.state import DeploymentDir
from tandem.errors import NotOwned, SpecError

USER_FILE = "keep-me.txt"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state root, with a folder of the user's beside it and one inside it (``victim``)."""
    root = tmp_path / "home"
    monkeypatch.setenv("TANDEM_HOME", str(root))
    for victim in (tmp_path / "victim", root / "victim", root / "caches" / "victim"):
        victim.mkdir(parents=True)
        (victim / USER_FILE).write_text("the user's")
    return root


def untouched(tmp_path: Path) -> bool:
    return all(
        (folder / USER_FILE).read_text() == "the user's"
        for folder in (tmp_path / "victim", tmp_path / "home" / "victim")
    )


@pytest.mark.parametrize(
    "name", ["..", "../victim", "../../victim", "/tmp", "a/b", "", "Tiny", "x" * 41, "-x", "x-"]
)
def test_a_name_that_is_not_a_deployment_name_is_refused(name):
    with pytest.raises(SpecError, match="not a deployment name"):
        ownership.check_name(name)
    with pytest.raises(SpecError):
        DeploymentDir.of(name)


@pytest.mark.parametrize("name", ["../victim", "..", "/victim", "../../victim"])
def test_purge_caches_with_a_path_for_a_name_removes_nothing(tandem_here, home, tmp_path, name):
    result = tandem_here("down", name, "--purge-caches")
    assert result.code == 2
    assert "not a deployment name" in result.err and "Traceback" not in result.err
    assert untouched(tmp_path) and (home / "caches" / "victim" / USER_FILE).exists()


def test_purge_caches_of_a_typo_says_nothing_was_there(tandem_here, home):
    result = tandem_here("down", "tiny-locl", "--purge-caches")
    assert result.code == 0
    assert "had no compile caches" in result.out and "removed" not in result.out


def test_purge_caches_removes_the_deployments_own_caches(tandem_here, home):
    rank = home / "caches" / "tiny-local" / "rank0" / "vllm"
    rank.mkdir(parents=True)
    (rank / "x").write_text("compiled")
    result = tandem_here("down", "tiny-local", "--purge-caches")
    assert result.code == 0 and "removed the compile caches" in result.out
    assert not (home / "caches" / "tiny-local").exists()
    assert (home / "caches" / "victim" / USER_FILE).exists()


def test_a_link_planted_at_a_cache_root_is_not_followed(tandem_here, home, tmp_path):
    (home / "caches" / "tiny-local").symlink_to(tmp_path / "victim")
    result = tandem_here("down", "tiny-local", "--purge-caches")
    assert result.code == 2 and "refusing to remove" in result.err
    assert untouched(tmp_path)


def test_inside_refuses_the_root_itself_and_anything_outside(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    assert ownership.inside(root / "a", root) == (root / "a").resolve()
    for outside in (root, tmp_path, root / ".." / "elsewhere", Path("/")):
        with pytest.raises(NotOwned):
            ownership.inside(outside, root)


def test_remove_tree_refuses_before_removing(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    with pytest.raises(NotOwned):
        ownership.remove_tree(tmp_path / "root" / ".." / "outside", root=tmp_path / "root")
    assert (tmp_path / "outside").is_dir()
    assert ownership.remove_tree(tmp_path / "root" / "absent", root=tmp_path / "root") is False


def test_forgetting_a_deployment_removes_its_state_file_alone_and_only_below_the_home(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    directory = DeploymentDir.of("kept-logs")
    directory.logs.mkdir(parents=True)
    directory.state_file.write_text("{}")
    (directory.logs / "rank0.log").write_text("log")
    directory.forget()
    assert not directory.state_file.exists() and (directory.logs / "rank0.log").exists()
    directory.forget()  # nothing left to forget: no error
    outside = DeploymentDir(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "state.json").write_text("{}")
    with pytest.raises(NotOwned):
        outside.forget()
    assert (tmp_path / "elsewhere" / "state.json").exists()


def test_the_run_dir_is_cleared_only_when_it_is_in_the_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    directory = DeploymentDir.of("linked")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / USER_FILE).write_text("the user's")
    if directory.run_dir.exists() or directory.run_dir.is_symlink():
        pytest.skip("a run dir of that name exists on this machine")
    directory.run_dir.symlink_to(tmp_path / "victim")
    try:
        with pytest.raises(NotOwned):
            directory.clear_run_dir()
        assert (tmp_path / "victim" / USER_FILE).exists()
    finally:
        directory.run_dir.unlink()


@pytest.mark.parametrize("name", ["../victim", "../../etc/passwd", "/x"])
def test_service_uninstall_refuses_a_name_that_leaves_its_folders(tandem_here, tmp_path, name):
    units = tmp_path / "units"
    units.mkdir()
    (tmp_path / "victim.env").write_text("A=1")
    result = tandem_here("service", "uninstall", name, "--unit-dir", str(units))
    assert result.code == 2 and "not a deployment name" in result.err
    assert (tmp_path / "victim.env").exists()


def test_render_out_refuses_a_folder_of_the_users(tandem_here, tmp_path):
    out = tmp_path / "prom"
    out.mkdir()
    (out / "README.md").write_text("mine")
    args = ["render", "tiny-local", "--target", "prometheus", "--out", str(out)]
    refused = tandem_here(*args)
    assert refused.code == 2 and "holds files tandem did not write (README.md)" in refused.err
    assert "--force" in refused.err and (out / "README.md").read_text() == "mine"
    assert tandem_here(*args, "--force").code == 0
    assert (out / "README.md").read_text() != "mine"


def test_render_out_writes_a_new_folder_and_again_into_its_own(tandem_here, tmp_path):
    out = tmp_path / "new" / "prom"
    args = ["render", "tiny-local", "--target", "prometheus", "--out", str(out)]
    assert tandem_here(*args).code == 0
    assert (out / ownership.OUTPUT_MARK).exists() and (out / "prometheus.yml").exists()
    assert tandem_here(*args).code == 0  # its own folder: written again


def test_an_out_folder_under_a_file_is_one_message(tandem_here, tmp_path):
    (tmp_path / "file").write_text("x")
    result = tandem_here(
        "render", "tiny-local", "--target", "prometheus", "--out", str(tmp_path / "file" / "sub")
    )
    assert result.code == 2 and "cannot create" in result.err and "Traceback" not in result.err
    result = tandem_here(
        "render", "tiny-local", "--target", "prometheus", "--out", str(tmp_path / "file")
    )
    assert result.code == 2 and "is a file" in result.err


def test_a_bundle_never_replaces_a_file(tandem_here, home, tmp_path):
    name = launched_local_state(tmp_path).name
    mine = tmp_path / "notes.tar.gz"
    mine.write_text("the user's")
    result = tandem_here("logs", name, "--bundle", str(mine))
    assert result.code == 2 and "exists" in result.err and mine.read_text() == "the user's"
    assert tandem_here("logs", name, "--bundle", str(tmp_path / "b.tar.gz")).code == 0


# Any name, any output path: nothing outside the state root and the folder tandem was told to
# create may change. Hypothesis draws names from the characters a path is made of.
NAMES = st.text(alphabet=st.sampled_from("./-_aZz0~ "), min_size=0, max_size=12)
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def snapshot(folder: Path, *, skip: Path) -> dict[str, tuple[float, int] | None]:
    """Every path below ``folder`` except ``skip``'s tree: a file with its modification time
    and inode (a replaced file has another), a folder as present."""
    found: dict[str, tuple[float, int] | None] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        found |= {str(here / d): None for d in dirnames}
        for entry in filenames:
            stat = (here / entry).lstat()
            found[str(here / entry)] = (stat.st_mtime, stat.st_ino)
    return found


@PROPERTY
@given(name=NAMES)
def test_no_name_makes_down_or_uninstall_touch_anything_outside(tmp_path_factory, name):
    base = tmp_path_factory.mktemp("prop")
    home = base / "a" / "b" / "home"
    for folder in (base / "a" / "victim", home / "victim", home / "caches" / "victim"):
        folder.mkdir(parents=True)
        (folder / USER_FILE).write_text("the user's")
    (base / "units").mkdir()
    before = snapshot(base, skip=home / "caches" / "xx")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_HOME", str(home))
        patch.chdir(base / "a")
        from tandem.cli import main

        main(["down", name, "--purge-caches"])
        main(["service", "uninstall", name, "--unit-dir", str(base / "units")])
    assert snapshot(base, skip=home / "caches" / "xx") == before


@PROPERTY
@given(name=NAMES)
def test_no_output_path_makes_render_write_outside_its_folder(tmp_path_factory, name):
    base = tmp_path_factory.mktemp("out")
    (base / "victim").mkdir()
    (base / "victim" / USER_FILE).write_text("the user's")
    target = (base / "work" / name) if name else base / "work"
    (base / "work").mkdir()
    before = snapshot(base, skip=target.resolve())
    from tandem.cli import main

    code = main(["render", "tiny-local", "--target", "prometheus", "--out", str(target)])
    after = snapshot(base, skip=target.resolve())
    assert {k: v for k, v in after.items() if k in before} == before
    created = {Path(k) for k in set(after) - set(before)}
    assert all(c in target.resolve().parents for c in created), created  # its parents only
    if code == 0:
        assert (target / ownership.OUTPUT_MARK).exists()
    assert (base / "victim" / USER_FILE).read_text() == "the user's"
