"""RotationAbandonable (docs/decisions.md#abandon-or-hold): which stages of a rotation may be abandoned when it is
deleted.

Pure data and one function, shared by the controller (abandon or DeletionHeld) and any client that wants to
refuse a delete up front.

    rotation     abandonable in                                     not in
    ca-rotation  "" (not started), Accepting, AwaitingCredentials;  Issuing with a target whose Issuing is its
                 Issuing when no target's Issuing is its point of   point of no return (Kubernetes, etcd);
                 no return                                          Dropping; Finalizing; Done

Until Issuing every node still trusts and issues with the old CAs. After Issuing the pods hold only the new
Kubernetes CA (kube-root-ca.crt), and an etcd member back on the old CA would not trust its neighbours; the
Talos and aggregator CAs survive Issuing because the old one is still accepted. Dropping removes the old CAs.
Which target is which is its description's ``issuing_is_point_of_no_return`` (ichord/pki/targets).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ichord.api.carotation import Stage
from ichord.pki import targets as ca_targets

if TYPE_CHECKING:
    from ichord.api.views import OperationView

#: Stages a rotation may be abandoned in, at least for some targets; a stage not listed is never abandonable.
ABANDONABLE_STAGES = (Stage.ACCEPTING, Stage.AWAITING_CREDENTIALS, Stage.ISSUING)


def forbidding_targets(stage: Stage) -> frozenset[str]:
    """The targets that make ``stage`` (one of ABANDONABLE_STAGES) past the point of no return."""
    if stage is Stage.ISSUING:
        return frozenset(t.name for t in ca_targets.REGISTRY if t.issuing_is_point_of_no_return)
    return frozenset()


def rotation_abandonable(stage: str, targets: Iterable[str]) -> bool:
    """True when a ca-rotation in ``stage`` ("" = not started) rotating ``targets`` may be abandoned."""
    if not stage:
        return True
    try:
        parsed = Stage.parse(stage)
    except ValueError:
        return False  # a stage this version does not know: never guess that it is safe
    if parsed not in ABANDONABLE_STAGES:
        return False
    return not (forbidding_targets(parsed) & set(targets))


def ca_rotation_abandonable(op: OperationView) -> bool:
    """RotationAbandonable for this operation's stage and targets (status once written, else the spec)."""
    targets = ((op.status.get("caRotation") or {}).get("targets")
               or (op.spec.get("caRotation") or {}).get("targets") or ca_targets.default_target_names())
    return rotation_abandonable(op.stage, [str(t) for t in targets])
