"""Issue 29: the TalosOperation CRD's enums are the code's, never a second list kept by hand.

A kind registered in ``default_registry`` that the CRD's ``spec.kind`` enum lacks could never be created (the API
server refuses it); a target, stage or phase the CRD lacks would make ichord's own status write fail. This test
names the list to change when a kind or a CA target is added.
"""

from __future__ import annotations

from typing import Any

from ichord.api.carotation import Stage
from ichord.api.names import Phase
from ichord.operations.kinds import default_registry
from ichord.pki.rotation import Target
from tests.unit.test_kube_crds import crds


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crds()["TalosOperation"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_the_kind_enum_is_the_registry() -> None:
    assert sorted(_schema()["properties"]["spec"]["properties"]["kind"]["enum"]) == sorted(default_registry().kinds)


def test_the_target_enum_is_every_target_in_the_codes_order() -> None:
    targets = _schema()["properties"]["spec"]["properties"]["caRotation"]["properties"]["targets"]["items"]["enum"]
    assert targets == [t.value for t in Target]


def test_the_stage_and_phase_enums_are_the_codes() -> None:
    status = _schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [v for k, v in vars(Phase).items() if k.isupper()]
    assert status["caRotation"]["properties"]["stage"]["enum"] == ["", *(s.value for s in Stage)]
