"""docs/decisions.md#config-rollout's plan as a table: who waits for what, in which order, and when a config operation
is refused."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.api.max_unavailable import DEFAULT, resolve
from ichord.api.views import OperationView
from ichord.operations.config.plan import (
    ORDER_LABEL,
    Candidate,
    Change,
    PlannedMachine,
    Refusal,
    plan_machines,
    plan_status,
    planned_from_status,
    refusal,
)


def cp(name: str, *, reboot: tuple[str, ...] = (), restart: tuple[str, ...] = (), node: str = "",
       order: int | None = None) -> Candidate:
    return Candidate(name, "controlplane", reboot, restart, node or name, order)


def worker(name: str, *, reboot: tuple[str, ...] = (), restart: tuple[str, ...] = (), node: str = "",
           order: int | None = None) -> Candidate:
    return Candidate(name, "worker", reboot, restart, node or name, order)


R = ("KernelModuleConfig br_netfilter (added)",)
A = ("cluster.apiServer.extraArgs",)

# (candidates, own node, expected [(name, change)])
PLANS: dict[str, tuple[list[Candidate], str | None, list[tuple[str, Change]]]] = {
    "nothing waits": ([cp("cp1"), worker("w1")], None, []),
    "a worker's restart paths are applied as safe, not planned": ([worker("w1", restart=A)], None, []),
    "control planes first, then workers, by name": (
        [worker("w2", reboot=R), worker("w1", reboot=R), cp("cp2", reboot=R), cp("cp1", reboot=R)], None,
        [("cp1", Change.REBOOT), ("cp2", Change.REBOOT), ("w1", Change.REBOOT), ("w2", Change.REBOOT)]),
    "the restart class on control planes only": (
        [cp("cp1", restart=A), worker("w1", restart=A), cp("cp2")], None, [("cp1", Change.API_SERVER_RESTART)]),
    "reboot wins over restart on one machine": ([cp("cp1", reboot=R, restart=A)], None, [("cp1", Change.REBOOT)]),
    "the order label orders a tier; unlabelled after": (
        [worker("wa", reboot=R), worker("wb", reboot=R, order=2), worker("wc", reboot=R, order=1)], None,
        [("wc", Change.REBOOT), ("wb", Change.REBOOT), ("wa", Change.REBOOT)]),
    "ichord's own node goes last, even a control plane": (
        [cp("cp1", reboot=R), cp("cp2", reboot=R, node="n-cp2"), worker("w1", reboot=R)], "n-cp2",
        [("cp1", Change.REBOOT), ("w1", Change.REBOOT), ("cp2", Change.REBOOT)]),
}


@pytest.mark.parametrize("case", list(PLANS))
def test_plan_order_and_classes(case: str) -> None:
    candidates, own, expected = PLANS[case]
    planned = plan_machines(candidates, own)
    assert [(p.name, p.change) for p in planned] == expected
    assert [p.order for p in planned] == list(range(1, len(expected) + 1))


def test_the_plan_round_trips_through_status_and_flags_a_single_control_plane() -> None:
    planned = plan_machines([cp("cp1", reboot=R), worker("w1", reboot=R)])
    bound = resolve(None, "50%", DEFAULT, 6)
    status = {"plan": plan_status(planned, control_planes=1, worker_bound=bound)}
    assert status["plan"]["kubernetesAPIUnavailable"] is True
    # The bound as resolved, in words and as data.
    assert status["plan"]["workerBound"] == {"atOnce": 3, "maxUnavailable": "50%", "source": "cluster", "workers": 6,
                                             "message": "workers 3 at a time (maxUnavailable 50% of 6 workers, the "
                                                        "TalosCluster's)"}
    assert any("then workers 3 at a time (maxUnavailable 50% of 6 workers" in w for w in status["plan"]["warnings"])
    assert planned_from_status(status) == planned
    assert status["plan"]["machines"][0] == {"name": "cp1", "role": "controlplane", "order": 1, "reboots": True,
                                             "change": "Reboot", "paths": list(R)}
    restart_only = plan_status(plan_machines([cp("cp1", restart=A)]), control_planes=3,
                               worker_bound=resolve(1, None, DEFAULT, 0))
    assert restart_only["kubernetesAPIUnavailable"] is False
    assert any("no reboot" in w for w in restart_only["warnings"])


def test_a_candidate_is_read_from_a_talos_machine() -> None:
    obj = {"metadata": {"name": "w1", "labels": {ORDER_LABEL: "3"}},
           "spec": {"role": "worker"}, "status": {"rebootPaths": list(R), "nodeName": "node-w1"}}
    assert Candidate.of(obj) == Candidate("w1", "worker", R, (), "node-w1", 3)
    obj["metadata"]["labels"][ORDER_LABEL] = "soon"
    obj["spec"]["hostname"] = "given"
    assert Candidate.of(obj).order is None and Candidate.of(obj).node_name == "given"


def _op(name: str, kind: str, *, phase: str = "", stage: str = "", created: str = "2026-01-01T00:00:00Z") -> Any:
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if stage:
        status["caRotation" if kind == "ca-rotation" else "stage"] = {"stage": stage} if kind == "ca-rotation" \
            else stage
    return OperationView.of({"metadata": {"name": name, "namespace": "ns", "uid": name,
                                          "creationTimestamp": created},
                             "spec": {"kind": kind, "clusterRef": {"name": "c"}}, "status": status})


REFUSALS: dict[str, tuple[list[Any], bool, Refusal | None]] = {
    "nothing waits": ([_op("me", "config")], False, Refusal.NOTHING_TO_DO),
    "alone with work": ([_op("me", "config")], True, None),
    "a rotation under way": ([_op("rot", "ca-rotation", phase="InProgress", stage="Issuing"), _op("me", "config")],
                             True, Refusal.CLUSTER_CA_ROTATING),
    "a rotation only planned": ([_op("rot", "ca-rotation", phase="Pending"), _op("me", "config")], True,
                                Refusal.CLUSTER_CA_ROTATING),
    "another config running": ([_op("other", "config", phase="InProgress", stage="Rolling"), _op("me", "config")],
                               True, Refusal.OPERATION_UNFINISHED),
    "finished ones do not count": ([_op("rot", "ca-rotation", phase="Completed", stage="Done"),
                                    _op("old", "config", phase="Failed"), _op("me", "config")], True, None),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals(case: str) -> None:
    ops, waiting, expected = REFUSALS[case]
    planned = [PlannedMachine("cp1", "controlplane", 1, Change.REBOOT, R)] if waiting else []
    got = refusal(planned, ops, "me")
    assert (got[0] if got else None) == expected
