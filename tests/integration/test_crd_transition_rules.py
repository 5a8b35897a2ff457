"""The CRDs' transition rules, enforced by the simulator serving helm/ichord/files/crds: an object's
spec.clusterRef (TalosMachine, TalosOperation) and spec.kind (TalosOperation) cannot change after
creation; every other spec field and the status still can."""

from __future__ import annotations

import pytest

from ichord.kube import errors
from ichord.kube.client import KubeClient
from ichord.kube.crds import machines, operations
from tests.integration._kube_helpers import machine

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"


async def test_cluster_ref_and_kind_are_immutable(kube: KubeClient) -> None:
    ops, ms = operations(kube), machines(kube)
    await ops.create(NS, {"metadata": {"name": "rotate"}, "spec": {"clusterRef": {"name": "c1"},
                                                                   "kind": "ca-rotation"}})
    with pytest.raises(errors.Invalid) as moved:
        await ops.patch(NS, "rotate", {"spec": {"clusterRef": {"name": "c2"}}})
    assert moved.value.status == 422
    assert 'spec.clusterRef: Invalid value: clusterRef is immutable' in str(moved.value)
    with pytest.raises(errors.Invalid) as kind:
        await ops.patch(NS, "rotate", {"spec": {"kind": "config"}})
    assert "spec.kind" in str(kind.value) and "kind is immutable" in str(kind.value)
    # Other fields change, and setting the same value is no change.
    paused = await ops.patch(NS, "rotate", {"spec": {"paused": True, "clusterRef": {"name": "c1"}}})
    assert paused["spec"]["paused"] is True and paused["spec"]["clusterRef"] == {"name": "c1"}
    status = await ops.patch_status(NS, "rotate", {"status": {"phase": "Pending", "observedGeneration": 2,
                                                              "caRotation": {"stage": "", "step": "verify"}}})
    assert status["status"]["observedGeneration"] == 2 and status["status"]["caRotation"]["step"] == "verify"

    await ms.create(NS, machine("cp-1"))
    with pytest.raises(errors.Invalid) as machine_moved:
        await ms.patch(NS, "cp-1", {"spec": {"clusterRef": {"name": "elsewhere"}}})
    assert "spec.clusterRef" in str(machine_moved.value) and "immutable" in str(machine_moved.value)
    approved = await ms.patch(NS, "cp-1", {"spec": {"approved": False}})
    assert approved["spec"]["approved"] is False
