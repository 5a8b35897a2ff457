"""RotationAbandonable (docs/decisions.md#abandon-or-hold): which stages of a rotation may be abandoned when it is
deleted.

Pure data and one function, shared by the controller (abandon or DeletionHeld) and any client that wants to
refuse a delete up front.

    rotation     abandonable in                                     not in
    ca-rotation  "" (not started), Accepting, AwaitingCredentials;  Issuing with the Kubernetes or etcd CA;
                 Issuing when neither kubernetes nor etcd is a      Dropping; Finalizing; Done
                 target

Until Issuing every node still trusts and issues with the old CAs. After Issuing the pods hold only the new
Kubernetes CA (kube-root-ca.crt), and an etcd member back on the old CA would not trust its neighbours; the
Talos and aggregator CAs survive Issuing because the old one is still accepted. Dropping removes the old CAs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ichord.api.carotation import Stage

if TYPE_CHECKING:
    from ichord.api.views import OperationView

#: stage -> the targets that make it past the point of no return; a stage not listed is never abandonable.
CA_ROTATION_ABANDONABLE: Mapping[Stage, frozenset[str]] = {
    Stage.ACCEPTING: frozenset(),
    Stage.AWAITING_CREDENTIALS: frozenset(),
    Stage.ISSUING: frozenset({"kubernetes", "etcd"}),
}

#: Absent spec.caRotation.targets means these (docs/decisions.md#ca-rotation-targets).
DEFAULT_TARGETS = ("talos", "kubernetes")


def rotation_abandonable(stage: str, targets: Iterable[str]) -> bool:
    """True when a ca-rotation in ``stage`` ("" = not started) rotating ``targets`` may be abandoned."""
    if not stage:
        return True
    try:
        parsed = Stage.parse(stage)
    except ValueError:
        return False  # a stage this version does not know: never guess that it is safe
    forbidding = CA_ROTATION_ABANDONABLE.get(parsed)
    if forbidding is None:
        return False
    return not (forbidding & set(targets))


def ca_rotation_abandonable(op: OperationView) -> bool:
    """RotationAbandonable for this operation's stage and targets (status once written, else the spec)."""
    targets = ((op.status.get("caRotation") or {}).get("targets")
               or (op.spec.get("caRotation") or {}).get("targets") or DEFAULT_TARGETS)
    return rotation_abandonable(op.stage, [str(t) for t in targets])
