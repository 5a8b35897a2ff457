"""A bundle Secret's event finds the clusters naming it from an index the clusters informer keeps, not a scan."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from ichord.api import views
from ichord.daemon import Daemon, DaemonSettings
from ichord.watchers.informer import Informer


def _cluster(name: str, secret: str, secret_ns: str | None = None) -> dict[str, Any]:
    ref = {"name": secret, **({"namespace": secret_ns} if secret_ns else {})}
    return {"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"}, "spec": {"secretsRef": ref}}


def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    informer._handle_line(json.dumps({"type": kind, "object": obj}).encode())  # the watch's own path


def test_the_index_follows_every_change_of_the_clusters_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = Daemon(DaemonSettings(), SimpleNamespace(on_written=lambda _plural, _fn: None))  # type: ignore[arg-type]
    _event(daemon.clusters, "ADDED", _cluster("a", "shared"))
    _event(daemon.clusters, "ADDED", _cluster("b", "shared"))
    _event(daemon.clusters, "ADDED", _cluster("c", "elsewhere", secret_ns="vault"))
    views_made = []
    real_of = views.ClusterView.of
    monkeypatch.setattr(views.ClusterView, "of", classmethod(lambda cls, obj: views_made.append(obj) or real_of(obj)))
    assert daemon._clusters_of_secret("ns", "shared") == [("ns", "a"), ("ns", "b")]
    assert daemon._clusters_of_secret("vault", "elsewhere") == [("ns", "c")]
    assert daemon._clusters_of_secret("ns", "elsewhere") == []
    assert views_made == []  # answered from the index: no cluster looked at
    monkeypatch.undo()
    _event(daemon.clusters, "MODIFIED", {**_cluster("b", "own"), "metadata": {
        "namespace": "ns", "name": "b", "resourceVersion": "2"}})  # b's secretsRef moved
    _event(daemon.clusters, "DELETED", _cluster("c", "elsewhere", secret_ns="vault"))
    assert daemon._clusters_of_secret("ns", "shared") == [("ns", "a")]
    assert daemon._clusters_of_secret("ns", "own") == [("ns", "b")]
    assert daemon._clusters_of_secret("vault", "elsewhere") == []
    assert daemon.runtime.bundle_owners._identity_of.keys() == {("ns", "a"), ("ns", "b")}  # nothing left of c
