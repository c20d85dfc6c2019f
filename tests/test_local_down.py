"""``down`` acts only on what its own state owns (no engine: a state with nothing running)."""

from __future__ import annotations

from factories import make_cluster, make_deployment

from tandem.backends.launch import new_state
from tandem.backends.local import LocalBackend
from tandem.rankplan import plan_ranks


def test_down_never_deletes_a_folder_the_state_file_names_as_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    deployment = make_deployment(
        cluster=make_cluster(transport="local", addresses=["10.77.0.1", "10.77.0.2"])
    )
    state = new_state(plan_ranks(deployment), deployment, backend="local")
    precious = tmp_path / "precious"
    (precious / "keep").mkdir(parents=True)
    state.run_dir = str(precious)  # a hand-edited or corrupted state.json
    state.save()
    LocalBackend().down(state, on_event=lambda text: None)
    assert (precious / "keep").is_dir()
    own = state.directory.run_dir
    own.mkdir(parents=True, exist_ok=True)
    state.run_dir = str(own)
    LocalBackend().down(state, on_event=lambda text: None)
    assert not own.exists()
