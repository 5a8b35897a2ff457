"""The accepted intent of an operation (operations/intent.py) and the chart's policy that guards it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ichord import yamlio
from ichord.api.views import OperationView
from ichord.operations.intent import accept, changed_fields, effective
from tests._helm import find_helm
from tests.unit.test_helm_chart import strip_actions

CHART = Path(__file__).resolve().parents[2] / "helm" / "ichord"


def test_changed_fields_name_every_path_but_paused() -> None:
    accepted = {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "caRotation": {"targets": ["talos"]}}
    assert changed_fields(accepted, {**accepted, "paused": True}) == []
    assert changed_fields(accepted, {**accepted, "caRotation": {"targets": ["talos", "etcd"]}}) == [
        "spec.caRotation.targets"]
    assert changed_fields(accepted, {**accepted, "maxUnavailable": 2}) == ["spec.maxUnavailable"]
    assert changed_fields(accepted, {"clusterRef": {"name": "demo"}, "kind": "ca-rotation"}) == [
        "spec.caRotation"]


def test_accept_records_the_spec_once_and_effective_runs_on_it_with_paused_live() -> None:
    op = {"metadata": {"name": "r", "namespace": "ns"},
          "spec": {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "paused": False, "maxUnavailable": 1}}
    status: dict[str, object] = {}
    accept(op)(status)
    assert status["acceptedSpec"] == {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "maxUnavailable": 1}
    accept({**op, "spec": {**op["spec"], "maxUnavailable": 5}})(status)  # kept: the first record wins
    assert status["acceptedSpec"]["maxUnavailable"] == 1  # type: ignore[index]
    changed = {**op, "spec": {**op["spec"], "maxUnavailable": "50%", "paused": True}, "status": status}
    view = effective(OperationView.of(changed))
    assert view.spec == {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "maxUnavailable": 1, "paused": True}
    assert OperationView.of(changed).spec["maxUnavailable"] == "50%"  # the object itself is not touched


def test_the_chart_policy_compares_every_spec_field_of_the_crd_but_paused() -> None:
    crd = yamlio.load((CHART / "files" / "crds" / "talosoperations.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    policy = (CHART / "templates" / "validatingadmissionpolicy.yaml").read_text()
    compared = set(re.findall(r"object\.spec\.(\w+) != oldObject\.spec\.\1", policy)) | set(
        re.findall(r"string\(object\.spec\.(\w+)\) != string\(oldObject\.spec\.\1\)", policy))
    assert compared == set(spec) - {"paused"}, "a spec field the admission policy does not guard (or names wrongly)"
    rules = next(d for d in yamlio.load_all(strip_actions(policy)) if d)
    # UPDATE of the main resource only: ichord's status writes (talosoperations/status) never meet the policy.
    assert rules["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["ichor.maesh.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
        "resources": ["talosoperations"]}]


@pytest.mark.skipif(find_helm() is None, reason="helm is not installed: the chart is not rendered")
@pytest.mark.parametrize(("kube_version", "installed"), [("1.29.0", False), ("1.30.0", True), ("1.36.3", True)])
def test_the_policy_is_rendered_where_the_api_server_serves_it(kube_version: str, installed: bool) -> None:
    helm = find_helm()
    assert helm is not None
    out = subprocess.run([helm, "template", "ichord", str(CHART), "--kube-version", kube_version],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    kinds = {str(d.get("kind")) for d in yamlio.load_all(out) if d}
    assert ("ValidatingAdmissionPolicy" in kinds) is installed
    assert ("ValidatingAdmissionPolicyBinding" in kinds) is installed
