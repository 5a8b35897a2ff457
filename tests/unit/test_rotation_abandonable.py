"""RotationAbandonable (docs/decisions.md#abandon-or-hold) as a table, and the ca-rotation kind's hook reading it."""

from __future__ import annotations

import pytest

from ichord.api.abandonable import rotation_abandonable
from ichord.api.views import OperationView
from ichord.operations.ca_rotation.status import CA_ROTATION

ALL = ["talos", "kubernetes", "etcd", "kubernetes-aggregator"]


@pytest.mark.parametrize(("stage", "targets", "expected"), [
    ("", ALL, True),
    ("Accepting", ALL, True),
    ("AwaitingCredentials", ["talos", "kubernetes"], True),
    ("Issuing", ["talos"], True),
    ("Issuing", ["kubernetes-aggregator"], True),
    ("Issuing", ["talos", "kubernetes-aggregator"], True),
    ("Issuing", ["talos", "kubernetes"], False),
    ("Issuing", ["etcd"], False),
    ("Issuing", ["kubernetes-aggregator", "etcd"], False),
    ("Dropping", ["talos"], False),
    ("Finalizing", ["kubernetes-aggregator"], False),
    ("Done", ["talos"], False),
    ("SomethingNew", ["talos"], False),
])
def test_the_table(stage: str, targets: list[str], expected: bool) -> None:
    assert rotation_abandonable(stage, targets) is expected


def _op(stage: str, status_targets: list[str] | None, spec_targets: list[str] | None) -> OperationView:
    spec: dict[str, object] = {"kind": "ca-rotation", "clusterRef": {"name": "c"}}
    if spec_targets is not None:
        spec["caRotation"] = {"targets": spec_targets}
    ca: dict[str, object] = {"stage": stage}
    if status_targets is not None:
        ca["targets"] = status_targets
    return OperationView.of({"metadata": {"name": "o", "namespace": "n"}, "spec": spec, "status": {"caRotation": ca}})


def test_the_kind_hook_reads_status_targets_first_then_the_spec_then_the_default() -> None:
    assert CA_ROTATION.abandonable(_op("Issuing", ["talos"], ["talos", "kubernetes"])) is True
    assert CA_ROTATION.abandonable(_op("Issuing", None, ["talos"])) is True
    assert CA_ROTATION.abandonable(_op("Issuing", None, None)) is False  # default: talos and kubernetes
    assert CA_ROTATION.abandonable(_op("Dropping", ["talos"], None)) is False
