"""The health gates' schema (docs/decisions.md#health-gates) on the real kube-apiserver: what it refuses, a whole
policy it keeps as written (on the TalosCluster and on a TalosOperation), and what `kubectl explain` shows. What the
schema lets through and ichord refuses (InvalidHealthGates) is tests/integration/test_health_gates.py's."""

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
POLICY = {"soak": "10m", "gates": [
    {"name": "nodes-ready", "cel": {"expression": 'nodes.all(n, n.status.conditions.exists(c, c.type == "Ready"))'}},
    {"name": "no-critical", "alertmanager": {"url": "http://am:9093", "matchers": ['severity="critical"']}},
    {"name": "errors", "prometheus": {"url": "https://prom:9090", "query": "sum(rate(e[5m]))", "threshold": 0.5,
                                      "caBundle": {"configMapKeyRef": {"name": "monitoring-ca", "key": "ca.crt"}}}},
    {"name": "private-am", "alertmanager": {"url": "https://am:9093", "matchers": ["severity=critical"],
                                            "caBundle": {"secretKeyRef": {"name": "am-ca", "key": "ca.crt"}}}},
    {"name": "settle", "delay": {"duration": "1h30m"}},
]}


def _cluster(name: str, health: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"secretsRef": {"name": "bundle"}, "endpoint": "https://10.5.0.2:6443",
                                                 "kubernetesVersion": "1.34.1", "health": health}}


@pytest.mark.parametrize(("health", "says"), [
    ({"soak": "10 minutes"}, "should match"),
    ({"gates": [{"name": "Bad_Name", "delay": {"duration": "1m"}}]}, "should match"),
    ({"gates": [{"name": "d", "delay": {"duration": "5"}}]}, "should match"),
    ({"gates": [{"name": "d", "delay": {}}]}, "Required value"),
    ({"gates": [{"name": "p", "prometheus": {"url": "prom:9090", "query": "up"}}]}, "should match"),
    ({"gates": [{"name": "a", "alertmanager": {"url": "http://am:9093", "matchers": []}}]}, "should have at least"),
    ({"gates": [{"name": "a", "alertmanager": {"url": "http://am:9093", "matchers": ["severity"]}}]}, "should match"),
    ({"gates": [{"name": "x", "delay": {"duration": "1m"}}, {"name": "x", "delay": {"duration": "2m"}}]},
     "Duplicate value"),
    ({"gates": [{"name": "p", "prometheus": {"url": "https://p", "query": "up", "caBundle": {}}}]},
     "set exactly one of configMapKeyRef and secretKeyRef"),
    ({"gates": [{"name": "p", "prometheus": {"url": "https://p", "query": "up", "caBundle": {
        "configMapKeyRef": {"name": "a", "key": "k"}, "secretKeyRef": {"name": "b", "key": "k"}}}}]},
     "set exactly one of configMapKeyRef and secretKeyRef"),
    ({"gates": [{"name": "p", "prometheus": {"url": "https://p", "query": "up", "caBundle": {
        "secretKeyRef": {"name": "b"}}}}]}, "Required value"),
])
async def test_bad_gates_are_refused(kube: KubeClient, health: dict[str, Any], says: str) -> None:
    with pytest.raises(errors.Invalid) as refused:
        await clusters(kube).create(NS, _cluster("gates-bad", health))
    assert says in str(refused.value), str(refused.value)
    with pytest.raises(errors.NotFound):
        await clusters(kube).get(NS, "gates-bad")


async def test_a_whole_policy_is_kept_as_written(kube: KubeClient) -> None:
    made = await clusters(kube).create(NS, _cluster("gates-ok", POLICY))
    try:
        assert made["spec"]["health"] == POLICY
    finally:
        await clusters(kube).delete(NS, "gates-ok")


def test_explain_shows_the_gates(control_plane: ControlPlane, crds: list[str]) -> None:
    kc = control_plane.admin_kubeconfig
    explain = run_kubectl(kc, "explain", "taloscluster.spec.health")
    for text in ("soak", "gates", "GateFailing", "status.healthGates", "InvalidHealthGates"):
        assert text in explain, explain
    explain = run_kubectl(kc, "explain", "taloscluster.spec.health.gates.cel")
    assert "nodes" in explain and "target" in explain, explain
    explain = run_kubectl(kc, "explain", "talosoperation.spec.health.gates.prometheus.threshold")
    assert "below" in explain, explain
    explain = run_kubectl(kc, "explain", "taloscluster.spec.health.gates.alertmanager.caBundle")
    assert "configMapKeyRef" in explain and "secretKeyRef" in explain and "InvalidHealthGates" in explain, explain
    explain = run_kubectl(kc, "explain", "talosoperation.spec.health.gates.prometheus.caBundle")
    assert "private CA" in explain and "never the certificates inline" in explain, explain
    explain = run_kubectl(kc, "explain", "talosoperation.status.healthGates")
    assert "soak" in explain and "passedFor" in explain, explain
