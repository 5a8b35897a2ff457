"""Issue 26, "intent is immutable once started", on the real kube-apiserver: the chart's ValidatingAdmissionPolicy
(helm/ichord/templates/validatingadmissionpolicy.yaml, as `helm template` renders it) makes the API server refuse a
``spec.caRotation.targets`` patch on a rotation whose stored status has left Pending, naming the field; spec.paused,
metadata and the status subresource stay writable, and an operation still Pending may be edited.

The status is written as the daemon writes it (phase, stage, acceptedSpec) through the status subresource: what
the policy reads is the stored object, whoever wrote it. The simulator's side (no policy: ignored and reported)
is tests/integration/test_operation_intent.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ichord import yamlio
from ichord.kube import crds as crd_api
from ichord.kube.client import KubeClient
from ichord.kube.errors import Invalid
from tests.real import tools
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]

CHART = Path(__file__).resolve().parents[2] / "helm" / "ichord"
NS = "default"
#: How long the API server may take to load a new policy (its informer, then the type check): a set-up bound.
POLICY_LOAD_TIMEOUT = 60.0
Obj = dict[str, Any]


def _policy_manifests(*values: str) -> str:
    helm = tools.tool("helm")
    if helm is None:
        pytest.skip(tools.missing("helm") or "helm is missing")
    return subprocess.run([str(helm), "template", "ichord", str(CHART), "--namespace", "ichord-system",
                           "--show-only", "templates/validatingadmissionpolicy.yaml", *values],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def _spec(targets: list[str]) -> Obj:
    return {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "caRotation": {"targets": targets}}


async def _running(kube: KubeClient, name: str, targets: list[str]) -> None:
    """A rotation as the daemon leaves it once started: InProgress in Accepting, the accepted spec recorded."""
    ops = crd_api.operations(kube)
    await ops.create(NS, {"metadata": {"name": name}, "spec": _spec(targets)})
    await ops.patch_status(NS, name, {"status": {"phase": "InProgress", "caRotation": {"stage": "Accepting"},
                                                 "acceptedSpec": _spec(targets)}})


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane, crds: list[str]) -> str:
    """The chart's policy and binding applied; returns once the API server enforces them."""
    rendered = _policy_manifests()
    assert "kind: ValidatingAdmissionPolicy\n" in rendered and "kind: ValidatingAdmissionPolicyBinding" in rendered
    run_kubectl(control_plane.admin_kubeconfig, "apply", "-f", "-", stdin=rendered)
    probe = {"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
             "metadata": {"name": "intent-probe", "namespace": NS}, "spec": _spec(["talos"])}
    path = f"/apis/ichor.maesh.dev/v1alpha1/namespaces/{NS}/talosoperations"
    control_plane.request("POST", path, probe)
    run_kubectl(control_plane.admin_kubeconfig, "patch", "-n", NS, "top", "intent-probe", "--subresource=status",
                "--type=merge", "-p", '{"status":{"phase":"InProgress"}}')
    deadline = time.monotonic() + POLICY_LOAD_TIMEOUT
    while True:
        out = run_kubectl(control_plane.admin_kubeconfig, "patch", "-n", NS, "top", "intent-probe", "--type=merge",
                          "-p", f'{{"spec":{{"maxUnavailable":{int(time.monotonic() * 1000 % 1000 + 1)}}}}}',
                          check=False)
        if "ValidatingAdmissionPolicy" in out:
            return out
        assert time.monotonic() < deadline, f"the policy was not enforced within {POLICY_LOAD_TIMEOUT:g} s: {out}"
        time.sleep(0.5)


async def test_a_targets_patch_on_a_running_rotation_is_refused(policy: str, kube: KubeClient) -> None:
    ops = crd_api.operations(kube)
    await _running(kube, "rotate-running", ["talos", "kubernetes"])
    with pytest.raises(Invalid) as refused:
        await ops.patch(NS, "rotate-running", {"spec": {"caRotation": {"targets": ["talos", "kubernetes", "etcd"]}}})
    message = str(refused.value)
    assert "spec.caRotation" in message and "status.phase InProgress" in message and "spec.paused" in message
    assert "ValidatingAdmissionPolicy 'ichord'" in message  # it names itself: the operator knows who refused
    stored = await ops.get(NS, "rotate-running")
    assert stored["spec"]["caRotation"]["targets"] == ["talos", "kubernetes"]
    # What stays writable: spec.paused, metadata (ichord's annotations, finalizers) and the status subresource.
    await ops.patch(NS, "rotate-running", {"spec": {"paused": True}})
    await ops.patch(NS, "rotate-running", {"metadata": {"annotations": {"ichor.maesh.dev/credentials-handoff": "x"},
                                                        "finalizers": ["ichor.maesh.dev/ca-rotation"]}})
    await ops.patch_status(NS, "rotate-running", {"status": {"caRotation": {"stage": "Issuing"}}})
    for field in ({"maxUnavailable": 3}, {"caRotation": None}):
        with pytest.raises(Invalid):
            await ops.patch(NS, "rotate-running", {"spec": field})
    await ops.patch(NS, "rotate-running", {"metadata": {"finalizers": None}})


async def test_an_operation_still_pending_may_be_edited(policy: str, kube: KubeClient) -> None:
    ops = crd_api.operations(kube)
    await ops.create(NS, {"metadata": {"name": "rotate-planned"}, "spec": {**_spec(["talos"]), "paused": True}})
    await ops.patch(NS, "rotate-planned", {"spec": {"caRotation": {"targets": ["talos", "etcd"]}}})  # no status yet
    await ops.patch_status(NS, "rotate-planned", {"status": {"phase": "Pending"}})  # plan only
    edited = await ops.patch(NS, "rotate-planned", {"spec": {"caRotation": {"targets": ["etcd"]}}})
    assert edited["spec"]["caRotation"]["targets"] == ["etcd"]


def test_kubectl_shows_the_refusal(policy: str, control_plane: ControlPlane) -> None:
    out = run_kubectl(control_plane.admin_kubeconfig, "patch", "-n", NS, "top", "intent-probe", "--type=merge",
                      "-p", '{"spec":{"caRotation":{"targets":["etcd"]}}}', check=False)
    assert "denied request" in out and "spec.caRotation" in out, out


def test_without_the_policy_the_chart_renders_none() -> None:
    helm = tools.tool("helm")
    assert helm is not None
    kinds = {str(d.get("kind")) for d in yamlio.load_all(subprocess.run(
        [str(helm), "template", "ichord", str(CHART), "--set", "admissionPolicy.enabled=false"],
        capture_output=True, text=True, check=True, timeout=60).stdout) if d}
    assert "Deployment" in kinds and not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & kinds
