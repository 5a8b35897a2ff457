"""ByCluster: each cluster's machines, kept from the informer's events, never another cluster's."""

from __future__ import annotations

import json
from typing import Any

from ichord.actors.machine_index import ByCluster
from ichord.watchers.informer import Informer, Resource


def _machine(ns: str, name: str, cluster: str | None, rv: int = 1) -> dict[str, Any]:
    spec = {"clusterRef": {"name": cluster}} if cluster else {}
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv)}, "spec": spec}


def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    informer._handle_line(json.dumps({"type": kind, "object": obj}).encode())  # the watch's own path


def _names(index: ByCluster, ns: str, cluster: str) -> list[str]:
    return [key[1] for key, _obj in index.objects(ns, cluster)]


def test_the_index_follows_adds_moves_and_deletes() -> None:
    informer = Informer(None, Resource("ichord.dev", "v1alpha1", "talosmachines"))  # type: ignore[arg-type]
    informer.cache[("a", "m2")] = _machine("a", "m2", "c1")  # already cached when the index starts
    index = ByCluster(informer)
    _event(informer, "ADDED", _machine("a", "m1", "c1"))
    _event(informer, "ADDED", _machine("a", "m3", "c2"))
    _event(informer, "ADDED", _machine("b", "m4", "c1"))  # the same cluster name in another namespace
    _event(informer, "ADDED", _machine("a", "m5", None))  # no clusterRef: nobody's
    assert _names(index, "a", "c1") == ["m1", "m2"]  # by name, as the scan gave them
    assert _names(index, "a", "c2") == ["m3"]
    assert _names(index, "b", "c1") == ["m4"]

    _event(informer, "MODIFIED", _machine("a", "m1", "c2", rv=2))  # its clusterRef changed
    assert _names(index, "a", "c1") == ["m2"]
    assert _names(index, "a", "c2") == ["m1", "m3"]
    _event(informer, "MODIFIED", _machine("a", "m5", "c1", rv=2))
    assert _names(index, "a", "c1") == ["m2", "m5"]

    _event(informer, "DELETED", _machine("a", "m2", "c1", rv=3))
    assert _names(index, "a", "c1") == ["m5"]
    assert len(index) == 4
    assert index.objects("a", "c1")[0][1] is informer.cache[("a", "m5")]  # the cached object itself


def test_an_object_changed_without_its_event_is_not_handed_to_the_wrong_cluster() -> None:
    informer = Informer(None, Resource("ichord.dev", "v1alpha1", "talosmachines"))  # type: ignore[arg-type]
    index = ByCluster(informer)
    _event(informer, "ADDED", _machine("a", "m1", "c1"))
    informer.cache[("a", "m1")] = _machine("a", "m1", "c9")  # the cache is the truth, the index a shortlist
    assert index.objects("a", "c1") == []
