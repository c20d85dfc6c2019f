"""A network in the ledger is an orphan only when no deployment record names it: since one
record owns its groups (b22f677), each group names its own network, and a sweep that read only
the record's top-level ``network`` removed a running deployment's namespaces (its ranks died
whenever any `tandem down` ran on the machine)."""

from __future__ import annotations

import json

from tandem.backends.netns import LedgerEntry, NetworkPlan, NodeNetwork


def entry(state_file, bridge: str = "tdmb1a8d91") -> LedgerEntry:
    plan = NetworkPlan(
        bridge=bridge,
        bridge_address="10.77.0.254",
        prefix=24,
        nodes=[
            NodeNetwork(
                node="node0",
                netns="tdm-x-node0",
                interface="tdm0",
                host_end="tdmh0",
                address="10.77.0.1",
            )
        ],
    )
    return LedgerEntry(plan=plan, maker_pid=1, maker_start_ticks=0, state_file=str(state_file))


def test_a_groups_network_is_claimed_by_its_deployments_record(tmp_path):
    record = tmp_path / "state.json"
    record.write_text(
        json.dumps(
            {"groups": [{"network": {"bridge": "other"}}, {"network": {"bridge": "tdmb1a8d91"}}]}
        )
    )
    assert entry(record).claimed()
    assert not entry(record, bridge="tdmbffffff").claimed()


def test_a_record_of_one_launch_still_claims_its_network(tmp_path):
    record = tmp_path / "state.json"
    record.write_text(json.dumps({"network": {"bridge": "tdmb1a8d91"}}))
    assert entry(record).claimed()
    for text in ("not json", "[]", json.dumps({"groups": "x", "network": None})):
        record.write_text(text)
        assert not entry(record).claimed()
    assert not entry(tmp_path / "gone.json").claimed()
