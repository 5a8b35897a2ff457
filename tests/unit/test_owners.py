"""actors/owners.py: who holds a node address or a bundle Secret, kept from the informer's events
(docs/decisions.md#one-owner)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ichord.actors.owners import OWNER_CHANGED, Owners, bundle_owners, machine_owners, node_address
from ichord.watchers.informer import Informer, Resource

Told = list[tuple[str, str, tuple[str, str], str]]


def _informer(plural: str) -> Informer:
    return Informer(None, Resource("ichor.maesh.dev", "v1alpha1", plural))  # type: ignore[arg-type]


def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    informer._handle_line(json.dumps({"type": kind, "object": obj}).encode())  # the watch's own path


def _machine(ns: str, name: str, address: str, created: str, cluster: str = "c1", rv: int = 1) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv), "creationTimestamp": created},
            "spec": {"clusterRef": {"name": cluster}, "address": address}}


def _cluster(ns: str, name: str, secret: str, created: str, secret_ns: str | None = None) -> dict[str, Any]:
    ref = {"name": secret, **({"namespace": secret_ns} if secret_ns else {})}
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": "1", "creationTimestamp": created},
            "spec": {"secretsRef": ref}}


@pytest.mark.parametrize(("one", "other"), [
    ("10.0.0.1", "10.0.0.1:50000"),
    (" 10.0.0.1 ", "10.0.0.1"),
    ("fd00:0:0::1", "[fd00::1]:50000"),
    ("[::ffff:10.0.0.1]", "10.0.0.1"),
    ("Node.Example.", "node.example:50000"),
])
def test_spellings_of_one_node_are_one_address(one: str, other: str) -> None:
    assert node_address(one) == node_address(other) is not None


@pytest.mark.parametrize(("one", "other"), [
    ("10.0.0.1", "10.0.0.2"),
    ("10.0.0.1:50000", "10.0.0.1:50001"),  # two simulated nodes on one IP are two nodes
    ("node-a.example", "node-b.example"),
])
def test_different_nodes_are_different_addresses(one: str, other: str) -> None:
    assert node_address(one) != node_address(other)


def test_no_address_is_nobody_s() -> None:
    assert node_address("") is None and node_address("   ") is None


def test_the_oldest_machine_holds_its_node_then_namespace_and_name_decide() -> None:
    informer = _informer("talosmachines")
    told: Told = []
    owners = machine_owners(informer, lambda: lambda *a: told.append(a))
    young = _machine("a", "young", "10.0.0.1:50000", "2026-01-02T00:00:00Z")
    _event(informer, "ADDED", young)
    _event(informer, "ADDED", _machine("b", "old", "10.0.0.1", "2026-01-01T00:00:00Z", cluster="c2"))
    _event(informer, "ADDED", _machine("a", "elsewhere", "10.0.0.9", "2025-01-01T00:00:00Z"))
    assert owners.holder(("a", "young"), young) == ("b", "old")  # another namespace and cluster: still one node
    assert owners.holder(("b", "old"), informer.cache[("b", "old")]) is None
    assert owners.holder(("a", "elsewhere"), informer.cache[("a", "elsewhere")]) is None
    # Created in the same second: the name decides, the same in every process.
    twin = _machine("a", "aaa", "10.0.0.1", "2026-01-01T00:00:00Z")
    assert owners.holder(("a", "aaa"), twin) is None  # not cached yet: counted as given
    assert owners.holder(("b", "old"), informer.cache[("b", "old")]) is None  # the index does not know it yet


def test_a_group_s_change_wakes_the_clusters_of_the_others() -> None:
    informer = _informer("talosmachines")
    told: Told = []
    owners = machine_owners(informer, lambda: lambda *a: told.append(a))
    _event(informer, "ADDED", _machine("a", "first", "10.0.0.1", "2026-01-01T00:00:00Z"))
    assert told == []  # alone: nobody else to tell
    _event(informer, "ADDED", _machine("b", "second", "10.0.0.1", "2026-01-02T00:00:00Z", cluster="c2"))
    assert told == [("a", "c1", ("TalosMachine", "first"), OWNER_CHANGED)]
    told.clear()
    _event(informer, "MODIFIED", _machine("a", "first", "10.0.0.1", "2026-01-01T00:00:00Z", rv=2))
    assert told == []  # the same address: no change of holder
    _event(informer, "DELETED", _machine("a", "first", "10.0.0.1", "2026-01-01T00:00:00Z"))
    assert told == [("b", "c2", ("TalosMachine", "second"), OWNER_CHANGED)]  # the second takes over now
    assert owners.holder(("b", "second"), informer.cache[("b", "second")]) is None
    told.clear()
    _event(informer, "ADDED", _machine("a", "third", "10.0.0.2", "2026-01-03T00:00:00Z"))
    _event(informer, "MODIFIED", _machine("a", "third", "10.0.0.1", "2026-01-03T00:00:00Z", rv=2))  # moved in
    assert told == [("b", "c2", ("TalosMachine", "second"), OWNER_CHANGED)]


def test_a_cluster_refused_its_secret_s_namespace_holds_nothing() -> None:
    informer = _informer("talosclusters")
    told: Told = []
    owners = bundle_owners(informer, lambda: lambda *a: told.append(a))
    _event(informer, "ADDED", _cluster("team", "intruder", "bundle", "2025-01-01T00:00:00Z", secret_ns="prod"))
    home = _cluster("prod", "home", "bundle", "2026-01-01T00:00:00Z")
    _event(informer, "ADDED", home)
    assert told == [("team", "intruder", ("TalosCluster", "intruder"), OWNER_CHANGED)]
    assert owners.members(("prod", "bundle")) == [("prod", "home"), ("team", "intruder")]
    assert owners.holder(("prod", "home"), home) == ("team", "intruder")  # by age alone
    assert owners.holder(("prod", "home"), home,
                         may_hold=lambda obj: obj["metadata"]["namespace"] == "prod") is None


def test_an_index_built_over_a_warm_cache_knows_its_objects() -> None:
    informer = _informer("talosmachines")
    informer.cache[("a", "m1")] = _machine("a", "m1", "10.0.0.1", "2026-01-01T00:00:00Z")
    owners = Owners(informer, lambda obj: obj["spec"]["address"], lambda _key, _obj: None)
    assert owners.members("10.0.0.1") == [("a", "m1")]
