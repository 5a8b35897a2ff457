"""docs/decisions.md#contract-match: what "the node runs the contract" means, and what a mismatch tells a person."""

from __future__ import annotations

import pytest

from ichord.api.contract_match import machine_message
from ichord.contract import V1_13, V1_14, VersionContract, runs_contract


@pytest.mark.parametrize(("tag", "contract", "runs"), [
    ("v1.14.5", V1_14, True),  # the patch release does not count
    ("v1.14.0", V1_14, True),
    ("v1.14.0-beta.1", V1_14, True),  # a pre-release of the line is of the line
    ("1.13.9", V1_13, True),
    ("v1.13.9", V1_14, False),
    ("v1.14.5", V1_13, False),
    ("v1.140.0", V1_14, False),  # not a prefix match
    ("v2.14.0", V1_14, False),
    ("", V1_14, False),  # no version reported: nothing applied
    ("simulated", V1_14, False),
])
def test_a_node_runs_a_contract_when_its_major_minor_is_the_contracts(tag: str, contract: VersionContract,
                                                                      runs: bool) -> None:
    assert runs_contract(tag, contract) is runs


def test_the_message_offers_the_contract_the_node_runs_only_when_ichord_renders_it() -> None:
    supported = machine_message("v1.13.9", V1_14, cluster="demo", namespace="ns")
    assert "Talos v1.13.9" in supported and "v1.14 contract" in supported
    command = """`kubectl -n ns patch taloscluster demo --type merge -p '{"spec":{"talosVersion":"v1.13"}}'`"""
    assert command in supported
    unsupported = machine_message("v1.15.0", V1_14, cluster="demo", namespace="ns")
    assert "kubectl" not in unsupported and "ichord renders v1.13, v1.14" in unsupported
    assert "(no version reported)" in machine_message("", V1_14, cluster="demo", namespace="ns")
