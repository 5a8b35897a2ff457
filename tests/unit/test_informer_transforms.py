"""What the daemon's informers cache: no managedFields on the CRDs, metadata only for the bundle Secrets."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest

from ichord.daemon import Daemon, DaemonSettings, metadata_only, without_managed_fields
from ichord.watchers.informer import Informer

MANAGED = [{"manager": "kubectl", "operation": "Update", "apiVersion": "ichord.dev/v1alpha1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:clusterRef": {".": {}, "f:name": {}}}}}]


def _obj(name: str, *, managed: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "resourceVersion": "7", "generation": 2,
                            "labels": {"a": "b"}, "annotations": {"c": "d"}}
    if managed:
        meta["managedFields"] = copy.deepcopy(MANAGED)
    return {"apiVersion": "ichord.dev/v1alpha1", "kind": "TalosMachine", "metadata": meta,
            "spec": {"clusterRef": {"name": "c1"}}, "status": {"conditions": [{"type": "Ready"}]}}


def test_only_managed_fields_are_dropped_and_the_input_is_left_as_it_is() -> None:
    obj = _obj("m1")
    kept = without_managed_fields(obj)
    expected = _obj("m1", managed=False)
    assert kept == expected
    assert obj["metadata"]["managedFields"] == MANAGED  # the caller's object is untouched


@pytest.mark.parametrize("obj", [_obj("m1", managed=False), {"kind": "X"}, {"metadata": None}])
def test_an_object_without_managed_fields_is_kept_whole(obj: dict[str, Any]) -> None:
    before = copy.deepcopy(obj)
    assert without_managed_fields(obj) == obj == before


def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    informer._handle_line(json.dumps({"type": kind, "object": obj}).encode())  # the watch's own path


def test_the_daemons_crd_informers_cache_no_managed_fields() -> None:
    # Nothing here talks to the API: a client that only takes the Runtime's write observer.
    daemon = Daemon(DaemonSettings(), SimpleNamespace(on_written=lambda _plural, _fn: None))  # type: ignore[arg-type]
    for informer in (daemon.clusters, daemon.machines, daemon.operations):
        _event(informer, "ADDED", _obj("x"))
        cached = informer.cache[("ns", "x")]
        assert "managedFields" not in cached["metadata"]
        assert cached == _obj("x", managed=False)  # spec, status, labels and resourceVersion kept
    for informer in daemon.bundles:
        secret = {**_obj("bundle"), "kind": "Secret", "data": {"secrets.yaml": "c2VjcmV0"}}
        _event(informer, "ADDED", secret)
        assert informer.cache[("ns", "bundle")] == metadata_only(secret)
        assert "data" not in informer.cache[("ns", "bundle")]


def test_objects_cached_from_separate_events_share_their_keys_and_short_strings() -> None:
    """Each watch event is decoded on its own: without interning every cached object holds its own copy of every
    key and repeated value (docs/scaling.md, "What a cluster costs")."""
    daemon = Daemon(DaemonSettings(), SimpleNamespace(on_written=lambda _plural, _fn: None))  # type: ignore[arg-type]
    long_message = "m" * 200
    for name in ("a", "b"):
        obj = _obj(name)
        obj["status"]["conditions"][0]["message"] = long_message
        _event(daemon.machines, "ADDED", obj)
    a, b = daemon.machines.cache[("ns", "a")], daemon.machines.cache[("ns", "b")]
    key_a = next(k for k in a["metadata"] if k == "resourceVersion")
    key_b = next(k for k in b["metadata"] if k == "resourceVersion")
    assert key_a is key_b
    assert a["apiVersion"] is b["apiVersion"] and a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["status"]["conditions"][0]["type"] is b["status"]["conditions"][0]["type"]  # inside a list
    assert a["status"]["conditions"][0]["message"] == long_message  # long strings kept, not necessarily shared
    assert a["metadata"]["generation"] == 2 and a == {**_obj("a", managed=False), "status": a["status"]}
