"""Each test bed that builds network namespaces has a subnet of its own; the docker bed says when
the disk cannot hold what it writes.

Two beds on one subnet collide when their lifetimes overlap (a module-scoped bed and a test that
builds its own network: ``ip link add ... File exists``, or one bed's addresses answering for
the other's), and whether they overlap depends on test order and timing, so the clash shows on
one run in several. A fresh loaded run found one (the docker bed on the start-up failure test's
10.79.0.0/24); this finds the next one without an engine.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import docker_hosts

TESTS = Path(__file__).resolve().parent
# A bed names its subnet as a keyword argument, a parameter default or a cluster YAML field.
BED_SUBNET = re.compile(r"\bsubnet(?:: str)?\s*[=:]\s*\"?(10\.\d{1,3}\.\d{1,3}\.0/24)")
DEFAULT_SUBNET = "10.77.0.0/24"
"""``local.subnet``'s default: the session's tiny-local deployment (``tests/conftest.py``)."""


def bed_subnets() -> dict[str, set[str]]:
    owners: dict[str, set[str]] = defaultdict(set)
    for path in sorted(TESTS.rglob("*.py")):
        for subnet in BED_SUBNET.findall(path.read_text()):
            owners[subnet].add(str(path.relative_to(TESTS)))
    return owners


def test_the_pattern_sees_every_kind_of_bed():
    owners = bed_subnets()
    assert "ssh_hosts.py" in owners["10.78.0.0/24"]  # a parameter default
    assert "check/test_probe.py" in owners["10.79.41.0/24"]  # a keyword argument
    assert "test_interrupts_engine.py" in owners["10.82.0.0/24"]  # a cluster YAML field


def test_no_two_test_files_build_a_network_on_one_subnet():
    shared = {s: sorted(files) for s, files in bed_subnets().items() if len(files) > 1}
    assert not shared, f"test beds share a subnet: {shared}"
    assert DEFAULT_SUBNET not in bed_subnets(), "the session's tiny-local deployment uses it"


def test_the_docker_bed_says_when_the_disk_cannot_hold_its_image(tmp_path: Path, monkeypatch):
    """Skipped with the figures, not ten errors of "no space left on device" in the middle:
    a machine without the cached image takes it in twice (the cache, then the second host
    beside it), each staged and then unpacked: three times the image at the peak."""
    monkeypatch.setattr(docker_hosts, "CACHE", tmp_path / "cache")
    assert docker_hosts.short_of_room(tmp_path / "bed", 1) is None
    reason = docker_hosts.short_of_room(tmp_path / "bed", 10**15)
    assert reason is not None
    assert f"{tmp_path}/cache and {tmp_path}/bed" in reason
    assert "the docker tests need 3000000.0 GB there" in reason
    assert "into the cache and then on the second host" in reason
