"""Issue 29: the TalosOperation CRD's enums are the code's, never a second list kept by hand.

A kind registered in ``default_registry`` that the CRD's ``spec.kind`` enum lacks could never be created (the API
server refuses it); a target, stage or phase the CRD lacks would make ichord's own status write fail. This test
names the list to change when a kind or a CA target is added.
"""

from __future__ import annotations

import re
from typing import Any

from ichord.api.carotation import Stage
from ichord.api.names import Phase
from ichord.api.operation_kinds import ETA_COLUMN, KINDS, PROGRESS_COLUMN, STAGE_COLUMN, STEP_COLUMN
from ichord.operations.kinds import default_registry
from ichord.pki.rotation import Target
from tests.unit.test_kube_crds import crds


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crds()["TalosOperation"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _version() -> dict[str, Any]:
    version: dict[str, Any] = crds()["TalosOperation"]["spec"]["versions"][0]
    return version


def test_the_kind_enum_is_the_registry() -> None:
    assert sorted(_schema()["properties"]["spec"]["properties"]["kind"]["enum"]) == sorted(default_registry().kinds)


def test_every_description_has_its_behaviour_and_the_crd_admits_it() -> None:
    """api/operation_kinds.py's table, the registry's kinds and the CRD's enum are one list: a described kind
    without an ``advance`` would sit UnsupportedKind, one the enum lacks could never be created."""
    registry = default_registry()
    enum = _schema()["properties"]["spec"]["properties"]["kind"]["enum"]
    assert sorted(KINDS) == sorted(registry.kinds) == sorted(enum)
    for name, operation in registry.kinds.items():
        assert operation.spec.description is KINDS[name], f"{name}: its behaviour is attached to another description"


def test_the_cel_rules_name_described_kinds_and_each_section_is_its_kinds_only() -> None:
    spec = _schema()["properties"]["spec"]
    rules = [r["rule"] for r in spec.get("x-kubernetes-validations") or []]
    named = {k for rule in rules for k in re.findall(r"self\.kind == '([^']+)'", rule)}
    assert named and named <= set(KINDS), f"a CEL rule names a kind no description has: {sorted(named - set(KINDS))}"
    for d in KINDS.values():
        if d.section is not None and d.section in spec["properties"]:
            assert f"!has(self.{d.section}) || self.kind == '{d.name}'" in rules, \
                f"spec.{d.section} is {d.name}'s options: a rule must refuse it on another kind"


def test_stage_columns_and_status_read_where_each_description_says() -> None:
    columns = {c["name"]: c["jsonPath"] for c in _version()["additionalPrinterColumns"]}
    assert columns["Kind"] == ".spec.kind"
    assert (columns["Stage"], columns["Step"]) == (STAGE_COLUMN, STEP_COLUMN)
    status = _schema()["properties"]["status"]["properties"]
    assert {"stage", "step"} <= set(status), "the printer columns' source is in every kind's status"
    for d in KINDS.values():
        if d.section is not None:  # kept in the kind's section, mirrored to the columns' source by the backbone
            assert {"stage", "step"} <= set(status[d.section]["properties"]), d.name


def test_progress_columns_read_what_the_backbone_writes_for_every_kind() -> None:
    columns = {c["name"]: c["jsonPath"] for c in _version()["additionalPrinterColumns"]}
    assert (columns["Progress"], columns["ETA"]) == (PROGRESS_COLUMN, ETA_COLUMN)
    progress = _schema()["properties"]["status"]["properties"]["progress"]["properties"]
    assert {p.rsplit(".", 1)[1] for p in (PROGRESS_COLUMN, ETA_COLUMN)} | {"done", "total"} <= set(progress)
    planned = {"plan": {"stages": ["Accepting", "Finalizing"], "machines": [{"name": "m", "reboots": True}]}}
    for d in KINDS.values():
        assert d.steps(planned), f"{d.name} counts no steps: its status.progress would never be written"


def test_every_kinds_condition_is_documented_on_the_crd() -> None:
    text = " ".join(_schema()["properties"]["status"]["properties"]["conditions"]["description"].split())
    for d in KINDS.values():
        assert re.search(rf"\b{d.condition_type}\b", text), f"{d.name}'s condition {d.condition_type} is not on the CRD"


def test_the_target_enum_is_every_target_in_the_codes_order() -> None:
    targets = _schema()["properties"]["spec"]["properties"]["caRotation"]["properties"]["targets"]["items"]["enum"]
    assert targets == [t.value for t in Target]


def test_the_stage_and_phase_enums_are_the_codes() -> None:
    status = _schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [v for k, v in vars(Phase).items() if k.isupper()]
    assert status["caRotation"]["properties"]["stage"]["enum"] == ["", *(s.value for s in Stage)]
