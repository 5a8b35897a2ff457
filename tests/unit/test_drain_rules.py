"""Which pods a drain leaves alone, and which it refuses (docs/decisions.md#config-rollout): a table."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.operations.managed.drain import MIRROR_ANNOTATION, skipped, unowned


def pod(*, owner: str | None = None, controller: bool = True, mirror: bool = False, phase: str = "Running") -> Any:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "controller": controller}]
    if mirror:
        meta["annotations"] = {MIRROR_ANNOTATION: "abc"}
    return {"metadata": meta, "status": {"phase": phase}}


CASES = {
    "a ReplicaSet's pod is evicted": (pod(owner="ReplicaSet"), False, False),
    "a DaemonSet's pod is left": (pod(owner="DaemonSet"), True, False),
    "a mirror pod is left": (pod(mirror=True), True, True),
    "a finished pod is left": (pod(phase="Succeeded"), True, True),
    "a bare pod is refused": (pod(), False, True),
    "an owner that is not a controller does not count": (pod(owner="ReplicaSet", controller=False), False, True),
    "a StatefulSet's pod is evicted": (pod(owner="StatefulSet"), False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_drain_rules(case: str) -> None:
    obj, want_skipped, want_unowned = CASES[case]
    assert skipped(obj) is want_skipped
    assert unowned(obj) is want_unowned
