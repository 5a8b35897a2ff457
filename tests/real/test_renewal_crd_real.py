"""The TalosCluster's spec.caRotation (docs/decisions.md#renewal-policy) on the real kube-apiserver: the values the
schema refuses (the simulator refuses the same, tests/integration/test_renewal_policy.py), the default approval,
and what `kubectl explain` shows."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.kube import errors
from ichord.kube.client import KubeClient
from ichord.kube.crds import clusters
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]
NS = "default"


def _cluster(name: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"secretsRef": {"name": "bundle"}, "endpoint": "https://10.5.0.2:6443",
                                                 "kubernetesVersion": "1.34.1", "caRotation": policy}}


@pytest.mark.parametrize("value", ["30 days", "0d", "30", "1.5h", "-1d", "30ms", "01d"])
async def test_malformed_renew_before_is_refused(kube: KubeClient, value: str) -> None:
    for policy in ({"renewBefore": value}, {"renewBeforeByTarget": {"kubernetes-aggregator": value}}):
        with pytest.raises(errors.Invalid) as refused:
            await clusters(kube).create(NS, _cluster("renew-bad", policy))
        assert "should match" in str(refused.value), str(refused.value)
    with pytest.raises(errors.NotFound):
        await clusters(kube).get(NS, "renew-bad")


async def test_approval_is_an_enum_defaulting_to_manual(kube: KubeClient) -> None:
    with pytest.raises(errors.Invalid) as refused:
        await clusters(kube).create(NS, _cluster("renew-enum", {"renewBefore": "30d", "approval": "Later"}))
    assert "Unsupported value" in str(refused.value)
    made = await clusters(kube).create(NS, _cluster("renew-ok", {"renewBefore": "1d12h",
                                                                 "renewBeforeByTarget": {"etcd": "720h"}}))
    try:
        assert made["spec"]["caRotation"] == {"renewBefore": "1d12h", "renewBeforeByTarget": {"etcd": "720h"},
                                              "approval": "Manual"}
    finally:
        await clusters(kube).delete(NS, "renew-ok")


def test_explain_shows_the_policy(control_plane: ControlPlane, crds: list[str]) -> None:
    kc = control_plane.admin_kubeconfig
    explain = run_kubectl(kc, "explain", "taloscluster.spec.caRotation")
    for text in ("renewBefore", "renewBeforeByTarget", "approval", "RotationDue", "renewal period"):
        assert text in explain, explain
    explain = run_kubectl(kc, "explain", "taloscluster.spec.caRotation.approval")
    assert "Manual" in explain and "Automatic" in explain and "AwaitingCredentials" in explain, explain
    explain = run_kubectl(kc, "explain", "taloscluster.spec.caRotation.renewBefore")
    assert "30d" in explain and "3650d" in explain, explain
