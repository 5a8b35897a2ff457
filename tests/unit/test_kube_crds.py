"""The chart's CRDs: structural schemas (a type on every node), the printer columns, the status
subresource, and the field names the code relies on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ichord import yamlio
from ichord.sim.kube import schema as sim_schema

CRD_DIR = Path(__file__).resolve().parents[2] / "helm" / "ichord" / "files" / "crds"
COLUMNS = {"TalosCluster": ["Ready", "Reason", "Expires", "Endpoint", "Contract", "Age"],
           "TalosMachine": ["Cluster", "Role", "Ready", "Reason", "Age"],
           "TalosOperation": ["Cluster", "Kind", "Phase", "Stage", "Step", "Progress", "ETA", "Age"]}


def crds() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yamlio.load(path.read_text())
        out[doc["spec"]["names"]["kind"]] = doc
    return out


def untyped(schema: dict[str, Any], path: str = "") -> list[str]:
    typed = "type" in schema or schema.get("x-kubernetes-preserve-unknown-fields") or \
        schema.get("x-kubernetes-int-or-string")  # int-or-string has no type (structural schema rule)
    bad = [] if typed else [path or "<root>"]
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


def undescribed(schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields without a description (what `kubectl explain` would show empty); metadata is ObjectMeta's."""
    bad = [] if schema.get("description") or path.endswith(".metadata") else [path or "<root>"]
    for key, sub in (schema.get("properties") or {}).items():
        bad += undescribed(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict) and schema["items"].get("properties"):
        bad += [p for p in undescribed(schema["items"], f"{path}[]") if p != f"{path}[]"]
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        bad += [p for p in undescribed(extra, f"{path}{{}}") if p != f"{path}{{}}"]
    return bad


@pytest.mark.parametrize("kind", sorted(COLUMNS))
def test_every_field_is_described_for_kubectl_explain(kind: str) -> None:
    schema = crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert undescribed(schema) == []


def _json_path_exists(schema: dict[str, Any], json_path: str) -> bool:
    node = schema
    for part in re.sub(r"\[[^\]]*\]", "", json_path).lstrip(".").split("."):
        node = (node.get("properties") or {}).get(part) or {}
        if not node:
            return False
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            node = node["items"]
    return True


@pytest.mark.parametrize("kind", sorted(COLUMNS))
def test_printer_columns_read_fields_the_schema_has(kind: str) -> None:
    (version,) = crds()[kind]["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"] != ".metadata.creationTimestamp":
            assert _json_path_exists(schema, column["jsonPath"]), column


def test_new_contract_fields() -> None:
    def props(kind: str, *path: str) -> dict[str, Any]:
        node = crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for p in path:
            node = node["properties"][p]
        return node
    assert props("TalosCluster", "status", "earliestExpiry")["format"] == "date-time"
    assert props("TalosOperation", "status", "observedGeneration")["type"] == "integer"
    assert props("TalosOperation", "status", "caRotation", "step")["type"] == "string"
    for kind in ("TalosMachine", "TalosOperation"):
        assert props(kind, "spec", "clusterRef")["x-kubernetes-validations"] == [
            {"rule": "self == oldSelf", "message": "clusterRef is immutable"}]
    assert props("TalosOperation", "spec", "kind")["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "kind is immutable"}]


@pytest.mark.parametrize("kind", ["TalosOperation", "TalosCluster"])
def test_max_unavailable_is_int_or_string_without_a_schema_default(kind: str) -> None:
    """Absent means "the cluster's, else the daemon's" (issue 19), so the schema defaults nothing; it refuses an int
    below 1 and any string but a percentage in (0%, 100%]."""
    field = crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "maxUnavailable"]
    assert field["x-kubernetes-int-or-string"] is True and "type" not in field and "default" not in field
    assert field["minimum"] == 1
    good, bad = ["1%", "25%", "50%", "99%", "100%"], ["0%", "101%", "05%", "4", "25", "2.5%", "", "%", "25 %"]
    assert [v for v in good if not re.search(field["pattern"], v)] == []
    assert [v for v in bad if re.search(field["pattern"], v)] == []


def _rules(schema: dict[str, Any]) -> list[str]:
    out = [r["rule"] for r in schema.get("x-kubernetes-validations") or []]
    for sub in (schema.get("properties") or {}).values():
        out += _rules(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += _rules(schema[key])
    return out


def test_the_simulator_evaluates_every_cel_rule_the_crds_use() -> None:
    rules = [r for crd in crds().values() for r in _rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])]
    # The operation lock and intent rules, caBundle's one-of on two gates of two CRDs, a maintenance window's bounds
    # (a recurring one's duration, a one-off one's start to end).
    assert len(rules) == 10
    assert [r for r in rules if not sim_schema.evaluates(r)] == []


@pytest.mark.parametrize(("window", "refused"), [
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4h"}, False),
    ({"name": "w", "start": "2026-12-24T20:00:00Z", "end": "2026-12-24T23:00:00Z"}, False),
    ({"name": "w", "schedule": "0 22 * * SAT"}, True),
    ({"name": "w", "start": "2026-12-24T20:00:00Z"}, True),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4h", "start": "2026-12-24T20:00:00Z",
      "end": "2026-12-24T23:00:00Z"}, True),
])
def test_the_simulator_refuses_a_window_neither_recurring_nor_one_off_as_the_api_server_does(
        window: dict[str, Any], refused: bool) -> None:
    # The real API server's answer to the same windows: tests/real/test_windows_crd_real.py.
    schema = crds()["TalosCluster"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"spec": {"secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
                    "maintenance": {"windows": [window]}}}
    causes = [c for c in sim_schema.validate(obj, schema) if "oneOf" in c[2]]
    assert bool(causes) is refused, causes
    if refused:
        assert causes[0][1] == "spec.maintenance.windows[0]"


@pytest.mark.parametrize(("bundle", "refused"), [
    ({"configMapKeyRef": {"name": "a", "key": "k"}}, False),
    ({"secretKeyRef": {"name": "b", "key": "k"}}, False),
    ({}, True),
    ({"configMapKeyRef": {"name": "a", "key": "k"}, "secretKeyRef": {"name": "b", "key": "k"}}, True),
])
def test_the_simulator_refuses_a_ca_bundle_of_neither_or_both_references_as_the_api_server_does(
        bundle: dict[str, Any], refused: bool) -> None:
    # The real API server's answer to the same bundles: tests/real/test_health_crd_real.py.
    schema = crds()["TalosCluster"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gate = {"name": "p", "prometheus": {"url": "https://p", "query": "up", "caBundle": bundle}}
    obj = {"spec": {"secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
                    "health": {"gates": [gate]}}}
    causes = [c for c in sim_schema.validate(obj, schema) if "set exactly one of" in c[2]]
    assert bool(causes) is refused, causes
    if refused:
        assert causes[0][1] == "spec.health.gates[0].prometheus.caBundle"


def _cluster_causes(**spec: Any) -> list[sim_schema.Cause]:
    schema = crds()["TalosCluster"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"spec": {"secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
                    **spec}}
    return sim_schema.validate(obj, schema)


WEEKLY = {"name": "w", "schedule": "0 22 * * SAT", "duration": "4h"}
ONE_OFF = {"name": "w", "start": "2026-12-24T20:00:00Z", "end": "2026-12-24T23:00:00Z"}


@pytest.mark.parametrize(("spec", "causes"), [
    ({"maintenance": {"windows": [WEEKLY, {**WEEKLY, "name": "v"}]}}, []),
    ({"maintenance": {"windows": [WEEKLY, {**WEEKLY, "schedule": "0 1 * * SUN"}]}},
     [("FieldValueDuplicate", "spec.maintenance.windows[1]", 'Duplicate value: {"name":"w"}')]),
    # Each key's first repetition only, as kube-apiserver names them.
    ({"maintenance": {"windows": [WEEKLY, {**WEEKLY, "name": "v"}, WEEKLY, WEEKLY]}},
     [("FieldValueDuplicate", "spec.maintenance.windows[2]", 'Duplicate value: {"name":"w"}')]),
    ({"maintenance": {"windows": [{**WEEKLY, "duration": "167h60m"}]}}, []),
    ({"maintenance": {"windows": [{**WEEKLY, "duration": "9999d"}]}},
     [("FieldValueInvalid", "spec.maintenance.windows[0].duration",
       'Invalid value: "9999d": a maintenance window lasts at most 7 days: 168h')]),
    ({"maintenance": {"windows": [{**ONE_OFF, "end": "2026-12-31T20:00:00Z"}]}}, []),  # exactly 168h
    ({"maintenance": {"windows": [{**ONE_OFF, "end": "2026-12-31T22:00:00+02:00"}]}}, []),  # the same instant
    ({"maintenance": {"windows": [{**ONE_OFF, "end": "2026-12-31T20:00:01Z"}]}},
     [("FieldValueInvalid", "spec.maintenance.windows[0]",
       "Invalid value: a one-off maintenance window lasts at most 7 days: end at most 168h after start")]),
    ({"etcdSnapshots": {"path": "/s", "retain": 99999999999}},
     [("FieldValueInvalid", "spec.etcdSnapshots.retain", "Invalid value: 99999999999: spec.etcdSnapshots.retain in "
       "body should be less than or equal to 1000")]),
])
def test_the_simulator_refuses_duplicate_window_names_and_unbounded_values_as_the_api_server_does(
        spec: dict[str, Any], causes: list[sim_schema.Cause]) -> None:
    # The real API server's answers to the same: tests/real/test_sim_differential.py (list-type map keys and bounds).
    assert _cluster_causes(**spec) == causes
