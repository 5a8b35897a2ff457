"""The chart's CRDs on the real kube-apiserver: accepted as structural, every CEL rule enforced, the
printer columns through ``kubectl get``, ``kubectl explain``; and the simulator's API-semantics cases
(tests/integration/test_kube_sim_api.py) run unchanged against the real server, so the simulator
and the real thing are held to the same expectations."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ichord import yamlio
from ichord.kube import errors
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters, machines, operations
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from tests.integration import test_kube_sim_api as sim_cases
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]
NS = "default"

# The simulator's cases, on the real server. Left out: the watch cases (they drive the simulator's
# compaction and its kube-root-ca.crt), eviction (needs the disruption controller to fill the PDB's
# status) and CRD registration (a real CR is served only once its CRD is Established).
test_crud_and_typed_errors = sim_cases.test_crud_and_typed_errors
test_stale_update_conflicts = sim_cases.test_stale_update_conflicts
test_delete_preconditions = sim_cases.test_delete_preconditions
test_status_subresource_and_generation = sim_cases.test_status_subresource_and_generation
test_finalizers_hold_deletion = sim_cases.test_finalizers_hold_deletion
test_schema_refusals_and_defaults = sim_cases.test_schema_refusals_and_defaults
test_patch_types = sim_cases.test_patch_types
test_label_and_field_selectors = sim_cases.test_label_and_field_selectors


@pytest.fixture
async def kube(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[KubeClient]:
    """The admin client, with the machines test_client_layer_real.py's cases leave behind (``m`` among them, which
    test_status_subresource_and_generation creates) gone first: the server is per session, that is per pytest-xdist
    worker, and the modules' tests reach it in any order."""
    client = await from_kubeconfig(control_plane.admin_kubeconfig)
    for name in ("m", "w", "c"):
        with contextlib.suppress(errors.NotFound):
            await machines(client).delete(NS, name)
    yield client
    await client.close()


def _crd_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(DEFAULT_CRD_DIR.glob("*.yaml")) for doc in yamlio.load_all(path.read_text())]


def _rules(schema: dict[str, Any]) -> list[str]:
    """The messages of every x-kubernetes-validations rule under ``schema``."""
    found = [r.get("message") or r["rule"] for r in schema.get("x-kubernetes-validations") or []]
    for sub in (schema.get("properties") or {}).values():
        found += _rules(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _rules(schema[key])
    return found


def test_crds_are_accepted_as_structural(control_plane: ControlPlane, crds: list[str]) -> None:
    assert sorted(crds) == sorted(d["metadata"]["name"] for d in _crd_docs())
    for name in crds:
        crd = json.loads(run_kubectl(control_plane.admin_kubeconfig, "get", "crd", name, "-o", "json"))
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True", conditions
        assert "NonStructuralSchema" not in conditions, crd["status"]["conditions"]


async def test_every_cel_rule_is_enforced(kube: KubeClient) -> None:
    """One case per rule the CRDs carry: a new rule without a case here fails this test."""
    ops = operations(kube)
    await ops.create(NS, {"metadata": {"name": "cel-kind"}, "spec": {"clusterRef": {"name": "c"}, "kind": "config"}})

    async def rotation_only_for_ca_rotation() -> None:
        await ops.create(NS, {"metadata": {"name": "cel-cfg"}, "spec": {
            "clusterRef": {"name": "c"}, "kind": "config", "caRotation": {"targets": ["talos"]}}})

    async def kind_is_immutable() -> None:
        await ops.patch(NS, "cel-kind", {"spec": {"kind": "ca-rotation"}})

    async def operation_cluster_ref_is_immutable() -> None:
        await ops.patch(NS, "cel-kind", {"spec": {"clusterRef": {"name": "other"}}})

    mach = machines(kube)
    await mach.create(NS, {"metadata": {"name": "cel-machine"}, "spec": {
        "clusterRef": {"name": "c"}, "role": "worker", "address": "10.5.0.9"}})

    async def machine_cluster_ref_is_immutable() -> None:
        await mach.patch(NS, "cel-machine", {"spec": {"clusterRef": {"name": "other"}}})

    ca_bundle_rule = "set exactly one of configMapKeyRef and secretKeyRef"
    both = {"configMapKeyRef": {"name": "a", "key": "k"}, "secretKeyRef": {"name": "b", "key": "k"}}
    gate_of = {"prometheus": {"url": "https://p:9090", "query": "up", "caBundle": both},
               "alertmanager": {"url": "https://am:9093", "matchers": ["alertname=Down"], "caBundle": {}}}

    def ca_bundle_of(kind: str, gate: str) -> Any:
        async def attempt() -> None:
            health = {"gates": [{"name": "g", gate: gate_of[gate]}]}
            if kind == "TalosCluster":
                await clusters(kube).create(NS, {"metadata": {"name": "cel-gates"}, "spec": {
                    "secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
                    "health": health}})
            else:
                await ops.create(NS, {"metadata": {"name": "cel-gates"}, "spec": {
                    "clusterRef": {"name": "c"}, "kind": "config", "health": health}})
        return attempt

    async def window_lasts_at_most_a_week() -> None:
        await clusters(kube).create(NS, {"metadata": {"name": "cel-window"}, "spec": {
            "secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
            "maintenance": {"windows": [{"name": "w", "schedule": "0 22 * * SAT", "duration": "9999d"}]}}})

    async def one_off_window_lasts_at_most_a_week() -> None:
        await clusters(kube).create(NS, {"metadata": {"name": "cel-one-off"}, "spec": {
            "secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
            "maintenance": {"windows": [{"name": "w", "start": "2026-12-24T20:00:00Z",
                                         "end": "2027-12-24T20:00:00Z"}]}}})

    cases = {
        **{f"{ca_bundle_rule} ({kind} {gate})": (
            ca_bundle_of(kind, gate), f"spec.health.gates[0].{gate}.caBundle: Invalid value: {ca_bundle_rule}")
           for kind in ("TalosCluster", "TalosOperation") for gate in ("prometheus", "alertmanager")},
        "caRotation is only valid for kind ca-rotation": (
            rotation_only_for_ca_rotation,
            "spec: Invalid value: caRotation is only valid for kind ca-rotation"),
        "kind is immutable": (kind_is_immutable, 'spec.kind: Invalid value: "ca-rotation": kind is immutable'),
        "clusterRef is immutable (TalosOperation)": (operation_cluster_ref_is_immutable,
                                                     "spec.clusterRef: Invalid value: clusterRef is immutable"),
        "clusterRef is immutable (TalosMachine)": (machine_cluster_ref_is_immutable,
                                                   "spec.clusterRef: Invalid value: clusterRef is immutable"),
        "a maintenance window lasts at most 7 days: 168h": (
            window_lasts_at_most_a_week, 'spec.maintenance.windows[0].duration: Invalid value: "9999d": a maintenance '
            "window lasts at most 7 days: 168h"),
        "a one-off maintenance window lasts at most 7 days: end at most 168h after start": (
            one_off_window_lasts_at_most_a_week, "spec.maintenance.windows[0]: Invalid value: a one-off maintenance "
            "window lasts at most 7 days: end at most 168h after start"),
    }
    rules = [m for d in _crd_docs() for v in d["spec"]["versions"] for m in _rules(v["schema"]["openAPIV3Schema"])]
    assert sorted(rules) == sorted(c.split(" (")[0] for c in cases), "every CEL rule of the CRDs needs a case here"
    for message, (attempt, expected) in cases.items():
        with pytest.raises(errors.Invalid) as refused:
            await attempt()
        assert expected in str(refused.value), (message, str(refused.value))
    # The refused writes left nothing behind.
    assert (await ops.get(NS, "cel-kind"))["spec"]["kind"] == "config"
    with pytest.raises(errors.NotFound):
        await ops.get(NS, "cel-cfg")


OBJECTS = """\
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosCluster
metadata: {name: cols}
spec: {secretsRef: {name: bundle}, endpoint: "https://10.5.0.2:6443", kubernetesVersion: "1.34.1"}
---
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosMachine
metadata: {name: cols-cp1}
spec: {clusterRef: {name: cols}, role: controlplane, address: 10.5.0.2}
---
apiVersion: ichor.maesh.dev/v1alpha1
kind: TalosOperation
metadata: {name: cols-rot}
spec: {clusterRef: {name: cols}, kind: ca-rotation}
"""


def test_printer_columns_and_explain(control_plane: ControlPlane, crds: list[str]) -> None:
    kc = control_plane.admin_kubeconfig
    run_kubectl(kc, "apply", "-f", "-", stdin=OBJECTS)
    expected = {d["spec"]["names"]["plural"]: ["NAME", *(c["name"].upper()
                                                        for c in d["spec"]["versions"][0]["additionalPrinterColumns"])]
                for d in _crd_docs()}
    for plural, header in expected.items():
        lines = run_kubectl(kc, "get", plural).splitlines()
        assert lines[0].split() == header, (plural, lines)
        assert any(line.startswith("cols") for line in lines[1:]), lines
    ops = run_kubectl(kc, "get", "talosoperations", "cols-rot").splitlines()
    assert ops[1].split()[:3] == ["cols-rot", "cols", "ca-rotation"]
    explain = run_kubectl(kc, "explain", "talosoperation.spec.kind")
    assert "ca-rotation" in explain and "config" in explain
    for kind in ("talosoperation", "taloscluster"):  # int-or-string (explain shows <Object>), described for both
        explain = run_kubectl(kc, "explain", f"{kind}.spec.maxUnavailable")
        assert "percentage" in explain and "25%" in explain and "--max-unavailable" in explain, explain
    explain = run_kubectl(kc, "explain", "talosmachine.spec")
    assert "clusterRef" in explain and "role" in explain
    run_kubectl(kc, "delete", "-f", "-", stdin=OBJECTS)
