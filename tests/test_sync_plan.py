"""``tandem sync``'s plan: which node copies what from whom (pure)."""

from __future__ import annotations

import pytest

from tandem.backends.sync import (
    ImageFacts,
    SnapshotFacts,
    parse_image,
    parse_snapshot,
    plan_sync,
)
from tandem.errors import BackendError

FILES = {
    "config.json": 1200,
    "model-00001-of-00002.safetensors": 5_000_000_000,
    "model-00002-of-00002.safetensors": 3_000_000_000,
}


def snaps(**files):
    return {node: SnapshotFacts(node, "abc", f) for node, f in files.items()}


@pytest.mark.parametrize(
    "snapshots, expected",
    [
        (snaps(a=FILES, b=FILES), []),
        (snaps(a=FILES, b={}), [("copy-snapshot", "b", "a")]),
        (snaps(a={}, b=FILES), [("copy-snapshot", "a", "b")]),
        (snaps(a=FILES, b={**FILES, "config.json": 7}), [("copy-snapshot", "b", "a")]),
        (
            snaps(a=FILES, b=dict(list(FILES.items())[:2]), c={}),
            [("copy-snapshot", "b", "a"), ("copy-snapshot", "c", "a")],
        ),
    ],
    ids=[
        "same everywhere",
        "worker lacks it",
        "leader lacks it",
        "a file of another size",
        "partial and empty",
    ],
)
def test_snapshot_copies_come_from_the_most_complete_node(snapshots, expected):
    actions = plan_sync(snapshots, {}, None, leader="a")
    assert [(a.kind, a.target, a.source) for a in actions] == expected


def test_no_snapshot_anywhere_says_how_to_get_one():
    with pytest.raises(BackendError) as info:
        plan_sync(snaps(a={}, b={}), {}, None, leader="a")
    assert "hf download" in info.value.hint


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
    actions = plan_sync({}, images, image, leader="a")
    assert [(a.kind, a.target, a.source) for a in actions] == expected


def test_probe_output_parses():
    facts = parse_snapshot("a", "commit 5b28\nconfig.json 12\nsub/dir/x.bin 34\n")
    assert facts.commit == "5b28" and facts.files == {"config.json": 12, "sub/dir/x.bin": 34}
    assert parse_image("a", "missing\n").image_id is None
    assert parse_image("a", "sha256:1 r/v@sha256:2").digests == ("r/v@sha256:2",)
