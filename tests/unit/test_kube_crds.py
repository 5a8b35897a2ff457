"""The chart's CRDs: structural schemas (a type on every node), api.md's printer columns, the status
subresource, and the field names api.md fixes as the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ichord import yamlio

CRD_DIR = Path(__file__).resolve().parents[2] / "helm" / "ichord" / "crds"
COLUMNS = {"TalosCluster": ["Endpoint", "Contract", "Age"],
           "TalosMachine": ["Cluster", "Role", "Ready", "Reason", "Age"],
           "TalosOperation": ["Cluster", "Kind", "Phase", "Stage", "Age"]}


def crds() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yamlio.load(path.read_text())
        out[doc["spec"]["names"]["kind"]] = doc
    return out


def untyped(schema: dict[str, Any], path: str = "") -> list[str]:
    bad = [] if "type" in schema or schema.get("x-kubernetes-preserve-unknown-fields") else [path or "<root>"]
    for key, sub in (schema.get("properties") or {}).items():
        bad += untyped(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        bad += untyped(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        bad += untyped(schema["additionalProperties"], f"{path}{{}}")
    return bad


@pytest.mark.parametrize("kind", sorted(COLUMNS))
def test_crd_is_structural_with_status_and_columns(kind: str) -> None:
    crd = crds()[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["spec"]["group"] == "ichor.maesh.dev"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == COLUMNS[kind]
    schema = version["schema"]["openAPIV3Schema"]
    assert untyped(schema) == []
    assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.ichor.maesh.dev"


def test_contract_fields_and_enums() -> None:
    spec = {k: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] for k, c in crds().items()}
    assert spec["TalosCluster"]["required"] == ["secretsRef", "endpoint", "kubernetesVersion"]
    assert spec["TalosCluster"]["properties"]["cni"]["properties"]["preset"]["enum"] == [
        "flannel", "cilium", "unmanaged"]
    assert spec["TalosMachine"]["properties"]["role"]["enum"] == ["controlplane", "worker"]
    op = spec["TalosOperation"]["properties"]
    assert op["kind"]["enum"] == ["ca-rotation", "config"]
    assert op["caRotation"]["properties"]["targets"]["items"]["enum"] == [
        "talos", "kubernetes", "etcd", "kubernetes-aggregator"]
    status = crds()["TalosOperation"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["phase"]["enum"] == ["Pending", "InProgress", "Paused", "Completed", "Failed"]
    assert set(status["properties"]) >= {"phase", "message", "startedAt", "completedAt", "plan", "caRotation",
                                         "machines", "conditions"}
