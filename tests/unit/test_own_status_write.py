"""Issue 32: a machine's own status write is no change of what it is reconciled from (actors/cluster.py), unless
another writer's change rode in on it (a 409's fresh read): then the node is read again at the next step."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ichord.actors.cluster import _only_status_changed
from ichord.api import names
from ichord.api.views import MachineView

READ: dict[str, Any] = {
    "apiVersion": names.API_VERSION, "kind": names.TALOS_MACHINE,
    "metadata": {"namespace": "ns", "name": "m1", "uid": "u1", "generation": 3, "resourceVersion": "10",
                 "labels": {"a": "b"}, "annotations": {"x": "y"}, "finalizers": ["f"]},
    "spec": {"clusterRef": {"name": "c"}, "role": "worker", "address": "10.0.0.1", "approved": True},
    "status": {},
}


def written(change: Any = None) -> dict[str, Any]:
    obj = copy.deepcopy(READ)
    obj["metadata"]["resourceVersion"] = "11"
    obj["status"] = {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}]}
    if change is not None:
        change(obj)
    return obj


def test_only_the_status_and_resource_version_changed() -> None:
    assert _only_status_changed(MachineView.of(READ), written())


@pytest.mark.parametrize("change", [
    lambda o: o["spec"].update(address="10.0.0.2"),
    lambda o: o["metadata"].update(generation=4),
    lambda o: o["metadata"]["annotations"].update(touched="1"),
    lambda o: o["metadata"]["labels"].pop("a"),
    lambda o: o["metadata"].update(finalizers=[]),
    lambda o: o["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
    lambda o: o["metadata"].update(uid="u2"),
], ids=["spec", "generation", "annotation", "label", "finalizers", "deleting", "recreated"])
def test_another_writers_change_that_rode_in_counts(change: Any) -> None:
    assert not _only_status_changed(MachineView.of(READ), written(change))
