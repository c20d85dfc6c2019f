"""``tandem sync``'s and ``tandem model pull``'s plans: which node copies what from whom (pure)."""

from __future__ import annotations

import pytest

from tandem.backends import pull, sync
from tandem.backends.pull import NodeSnapshot
from tandem.backends.sync import ImageFacts, SyncAction, parse_image, plan_images
from tandem.errors import BackendError
from tandem.hf_cache import ManifestFile, SnapshotManifest

COMMIT = "5b28" * 10
FILES = {
    "config.json": ("a" * 40, 1200),
    "model-00001-of-00002.safetensors": ("b" * 64, 5_000_000_000),
    "model-00002-of-00002.safetensors": ("c" * 64, 3_000_000_000),
}
MANIFEST = SnapshotManifest(
    repo_id="org/m",
    revision="main",
    commit=COMMIT,
    files={n: ManifestFile(blob=b, size=s) for n, (b, s) in FILES.items()},
)


def held(files: dict[str, tuple[str, int]], commit: str = COMMIT, **faults) -> NodeSnapshot:
    return NodeSnapshot(
        "b",
        {
            "exists": bool(files),
            "commit": commit,
            "files": [{"name": n, "blob": b, "size": s} for n, (b, s) in files.items()],
            **faults,
        },
    )


@pytest.mark.parametrize(
    "snapshot, lacks",
    [
        (held(FILES), []),
        (held({}), sorted(FILES)),
        (held(dict(list(FILES.items())[:2])), ["model-00002-of-00002.safetensors"]),
        (held({**FILES, "config.json": ("a" * 40, 7)}), ["config.json"]),
        (held({**FILES, "config.json": ("d" * 40, 1200)}), ["config.json"]),
        (held(FILES, commit="0" * 40), sorted(FILES)),
    ],
    ids=["whole", "empty", "a shard short", "another size", "another blob", "another commit"],
)
def test_a_node_lacks_what_it_does_not_hold_as_published(snapshot, lacks):
    assert snapshot.lacks(MANIFEST) == lacks


def test_only_a_sound_snapshot_can_be_a_source():
    assert held(FILES).sound
    assert not held({}).sound
    for fault in ("corrupt", "broken_links", "missing_shards", "incomplete_blobs"):
        assert not held(FILES, **{fault: ["x"]}).sound, fault


def test_a_sound_node_gives_the_manifest_of_what_it_holds():
    assert held(FILES).manifest("org/m", "main") == MANIFEST


@pytest.mark.parametrize(
    "image, facts, expected",
    [
        ("r/v@sha256:" + "1" * 64, [("a", "sha256:x"), ("b", None)], [("pull-image", "b", None)]),
        ("r/v:1", [("a", "sha256:x"), ("b", None)], [("copy-image", "b", "a")]),
        ("r/v:1", [("a", "sha256:x"), ("b", "sha256:y")], [("copy-image", "b", "a")]),
        ("r/v:1", [("a", "sha256:x"), ("b", "sha256:x")], []),
    ],
    ids=["pinned: pull", "tag: copy from a node", "different ids", "same id"],
)
def test_images_are_pulled_when_pinned_else_copied(image, facts, expected):
    images = {n: ImageFacts(n, i) for n, i in facts}
    actions = plan_images(images, image, leader="a")
    assert [(a.kind, a.target, a.source) for a in actions] == expected


def test_an_image_nobody_holds_and_nobody_can_pull_is_refused():
    with pytest.raises(BackendError) as info:
        plan_images({"a": ImageFacts("a", None)}, "r/v:1", leader="a")
    assert info.value.field == "engine.image"


def test_probe_output_parses():
    assert parse_image("a", "missing\n").image_id is None
    held = parse_image("a", "sha256:1 2900000000 r/v@sha256:2")
    assert held.digests == ("r/v@sha256:2",) and held.size == 2_900_000_000


def test_a_snapshot_copy_is_refused_where_the_cache_has_no_room():
    """Every short node named at once, before a byte moves; a node whose room is unknown (an
    older agent) is not judged."""
    found = {
        "b": held({}, free_bytes=7_000_000_000, repo_dir="/hf/hub/models--org--m"),
        "c": held({}, free_bytes=9_000_000_000),
        "d": held({}, free_bytes=1_000),
        "e": held({}),
    }
    need = dict.fromkeys(found, 8_000_001_200)
    with pytest.raises(BackendError) as info:
        pull.refuse_short_of_room(need, found)
    message = info.value.message
    assert "b lacks 8.00 GB of it and has 7.00 GB free under /hf/hub/models--org--m" in message
    assert "d lacks" in message and "c lacks" not in message and "e lacks" not in message
    assert "nothing was copied" in info.value.hint
    pull.refuse_short_of_room({"c": 8_000_001_200, "e": 10**15}, found)


def test_an_image_copy_needs_twice_its_size_under_the_targets_docker_root():
    """``docker load`` writes the archive out under its root, then unpacks the layers beside
    it: 2.9 GB of image needs 5.8 GB there."""
    images = {"a": ImageFacts("a", "sha256:x", size=2_900_000_000), "b": ImageFacts("b", None)}
    copies = [SyncAction("copy-image", "b", "a", "r/v:1")]
    roomy = {"b": f"{6_000_000_000 // 1024} /var/lib/docker\n"}
    sync.refuse_short_of_room(copies, images, roomy)
    tight = {"b": f"{4_000_000_000 // 1024} /srv/docker\n"}
    with pytest.raises(BackendError) as info:
        sync.refuse_short_of_room(copies, images, tight)
    assert info.value.message == (
        "not enough room for image r/v:1: b has 4.00 GB free under /srv/docker, the copy needs "
        "5.80 GB (the 2.90 GB archive and its layers)"
    )
    assert info.value.field == "engine.image"
    sync.refuse_short_of_room(copies, images, {"b": "\n"})  # no df: not judged
