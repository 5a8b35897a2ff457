"""The informer router, row by row (issue 13): which changes wake which cluster's actor, and which do not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ichord.watchers.informer import WatchEvent
from ichord.watchers.routing import Router

Obj = dict[str, Any]


def obj(name: str = "x", *, cluster: str | None = "c1", generation: int = 1, status: Obj | None = None,
        **meta: Any) -> Obj:
    """A builder: an object of namespace ns naming ``cluster``; mods as keyword arguments on metadata."""
    o: Obj = {"metadata": {"namespace": "ns", "name": name, "generation": generation, **meta},
              "spec": {"clusterRef": {"name": cluster}} if cluster else {}}
    if status is not None:
        o["status"] = status
    return o


def changed(o: Obj, **kw: Any) -> Obj:
    n = copy.deepcopy(o)
    for k, v in kw.items():
        if k == "status":
            n["status"] = v
        elif k == "cluster":
            n["spec"]["clusterRef"]["name"] = v
        else:
            n["metadata"][k] = v
    return n


BASE = obj()
# (handler, event, expected tells as (namespace, cluster, (kind, name), reason))
TABLE: dict[str, tuple[str, WatchEvent, list[tuple[str, str, tuple[str, str], str]]]] = {
    "a cluster added": ("on_cluster", WatchEvent("ADDED", obj("c1", cluster=None)),
                        [("ns", "c1", ("TalosCluster", "c1"), "ADDED")]),
    "a cluster's status only: not routed (the actor wrote it)": (
        "on_cluster", WatchEvent("MODIFIED", changed(obj("c1", cluster=None), status={"a": 1}),
                                 obj("c1", cluster=None)), []),
    "a cluster's spec (generation)": (
        "on_cluster", WatchEvent("MODIFIED", changed(obj("c1", cluster=None), generation=2), obj("c1", cluster=None)),
        [("ns", "c1", ("TalosCluster", "c1"), "MODIFIED")]),
    "a cluster's annotations": (
        "on_cluster", WatchEvent("MODIFIED", changed(obj("c1", cluster=None), annotations={"k": "v"}),
                                 obj("c1", cluster=None)), [("ns", "c1", ("TalosCluster", "c1"), "MODIFIED")]),
    "a machine's status only: not routed": (
        "on_machine", WatchEvent("MODIFIED", changed(BASE, status={"s": 1}), BASE), []),
    "a machine moved between clusters wakes both": (
        "on_machine", WatchEvent("MODIFIED", changed(BASE, cluster="c2", generation=2), BASE),
        [("ns", "c1", ("TalosMachine", "x"), "MODIFIED"), ("ns", "c2", ("TalosMachine", "x"), "MODIFIED")]),
    "a machine deleted": ("on_machine", WatchEvent("DELETED", BASE), [("ns", "c1", ("TalosMachine", "x"), "DELETED")]),
    "an operation's status: routed (its stage decides whether machines stand aside)": (
        "on_operation", WatchEvent("MODIFIED", changed(BASE, status={"phase": "InProgress"}), BASE),
        [("ns", "c1", ("TalosOperation", "x"), "MODIFIED")]),
    "an operation unchanged (a resync): not routed": (
        "on_operation", WatchEvent("MODIFIED", copy.deepcopy(BASE), BASE), []),
    "an operation naming no cluster: nowhere to go": ("on_operation", WatchEvent("ADDED", obj(cluster=None)), []),
    "a labelled bundle Secret changed: the clusters naming it": (
        "on_bundle_secret", WatchEvent("MODIFIED", obj("s1", cluster=None), obj("s1", cluster=None)),
        [("ns", "c1", ("Secret", "s1"), "MODIFIED"), ("ns", "c9", ("Secret", "s1"), "MODIFIED")]),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_routing_table(case: str) -> None:
    handler, event, expected = TABLE[case]
    told: list[tuple[str, str, tuple[str, str], str]] = []
    router = Router(lambda ns, cluster, key, reason: told.append((ns, cluster, key, reason)),
                    lambda ns, name: [("ns", "c1"), ("ns", "c9")] if name == "s1" else [])
    router.active = True
    getattr(router, handler)(event)
    assert sorted(told) == sorted(expected)


def test_a_follower_routes_nothing() -> None:
    told: list[Any] = []
    router = Router(lambda *a: told.append(a), lambda ns, name: [("ns", "c1")])
    for handler, event, _ in TABLE.values():
        getattr(router, handler)(event)
    assert told == []
