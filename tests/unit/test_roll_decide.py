"""The reboot roll's decision table (roll_state.decide), row by row, with an injected clock; and the marker's
round trip through a status document (roll_store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION, NodeView
from ichord.operations.roll_state import (
    Action,
    Observations,
    RollMarker,
    RollReason,
    RollTarget,
    closed,
    decide,
    failed,
    next_target,
)
from ichord.operations.roll_store import MarkerFields, marker_from_status, status_with_marker
from ichord.settings import Timing

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
TIMING = Timing()  # reboot_retry 300 s, node_action_timeout 1200 s, retry 30 s, reboot_poll 10 s
PLAN = [RollTarget(f"cp-{i}", f"10.0.0.{i}:50000", f"node-{i}") for i in (1, 2, 3)]
OLD, NEW = "boot-old", "boot-new"


def node(name: str = "node-1", *, ready: bool = True, boot: str = OLD, unschedulable: bool = False,
         ours: bool = False) -> NodeView:
    return NodeView(name, "7", ready, boot, unschedulable, ours)


def rebooting(machine: str = "cp-1", *, seconds_ago: float = 0.0, done: tuple[str, ...] = ()) -> RollMarker:
    return RollMarker(machine, OLD, T0 - timedelta(seconds=seconds_ago), done)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# (marker, observations, seconds after T0, expected action, reason, machine, requeue/retry after)
ROWS = [
    pytest.param(RollMarker(), Observations(node=node()), 0, Action.CORDON, RollReason.CORDONED, "cp-1", 0.0,
                 id="first node, schedulable: cordon"),
    pytest.param(RollMarker(), Observations(node=node(unschedulable=True, ours=True)), 0, Action.REBOOT,
                 RollReason.REBOOTING, "cp-1", 0.0, id="cordoned by ichord: reboot"),
    pytest.param(RollMarker(), Observations(node=node(unschedulable=True)), 0, Action.REBOOT, RollReason.REBOOTING,
                 "cp-1", 0.0, id="cordoned by a person: reboot without cordoning"),
    pytest.param(RollMarker(done=("cp-1",)), Observations(node=node("node-2")), 0, Action.CORDON,
                 RollReason.CORDONED, "cp-2", 0.0, id="next in order after the done ones"),
    pytest.param(RollMarker(done=("cp-1", "cp-2", "cp-3")), Observations(), 0, Action.FINISH, RollReason.DONE, None,
                 0.0, id="every machine done"),
    pytest.param(RollMarker(), Observations(node=node(), gate=closed("etcd on cp-2 is unhealthy")), 0, Action.BLOCK,
                 RollReason.GATE_CLOSED, "cp-1", 30.0, id="gate closed: blocked, retry 30 s"),
    pytest.param(RollMarker(), Observations(node=node(unschedulable=True, ours=True), gate=closed("x")), 0,
                 Action.BLOCK, RollReason.GATE_CLOSED, "cp-1", 30.0, id="gate closed after the cordon: blocked"),
    pytest.param(RollMarker(), Observations(node_error="connection refused"), 0, Action.BLOCK,
                 RollReason.MANAGED_API_UNAVAILABLE, "cp-1", 30.0, id="Node unreadable before the reboot"),
    pytest.param(RollMarker(), Observations(node_error="not found", node_missing=True), 0, Action.BLOCK,
                 RollReason.NODE_NOT_FOUND, "cp-1", 30.0, id="no such Node"),
    pytest.param(rebooting(), Observations(node=node(), boot_id=OLD), 0, Action.WAIT, RollReason.REBOOTING, "cp-1",
                 10.0, id="marker, same boot just after: wait (poll)"),
    pytest.param(rebooting(), Observations(node=node(), boot_id=OLD), 295, Action.WAIT, RollReason.REBOOTING,
                 "cp-1", 5.0, id="marker, same boot, 5 s before reboot_retry: wait until it"),
    pytest.param(rebooting(), Observations(node=node(), boot_id=OLD), 300, Action.ASK_AGAIN,
                 RollReason.REBOOT_REQUESTED_AGAIN, "cp-1", 0.0, id="marker, same boot at reboot_retry: ask again"),
    pytest.param(rebooting(), Observations(node=node(), boot_id=OLD, stopping=True), 400, Action.WAIT,
                 RollReason.REBOOTING, "cp-1", 10.0, id="same boot past reboot_retry but shutting down: wait"),
    pytest.param(rebooting(), Observations(node=node(), boot_id=OLD, stopping=True), 1200, Action.TIME_OUT,
                 RollReason.NODE_TIMED_OUT, "cp-1", 30.0, id="shutting down at the bound: pause"),
    pytest.param(rebooting(), Observations(node=node(ready=False), boot_error="connection refused"), 60,
                 Action.WAIT, RollReason.REBOOTING, "cp-1", 10.0, id="marker, Talos silent: wait"),
    pytest.param(rebooting(), Observations(node_error="refused", boot_error="refused"), 1195, Action.WAIT,
                 RollReason.REBOOTING, "cp-1", 5.0, id="marker, Talos silent, 5 s before the bound"),
    pytest.param(rebooting(), Observations(node_error="refused", boot_error="refused"), 1200, Action.TIME_OUT,
                 RollReason.NODE_TIMED_OUT, "cp-1", 30.0, id="marker, Talos silent at the bound: pause"),
    pytest.param(rebooting(), Observations(node=node(ready=False, boot=OLD), boot_id=NEW), 90, Action.WAIT,
                 RollReason.AWAITING_NODE, "cp-1", 10.0, id="new boot, Node not Ready: wait"),
    pytest.param(rebooting(), Observations(node=node(ready=True, boot=OLD), boot_id=NEW), 90, Action.WAIT,
                 RollReason.AWAITING_NODE, "cp-1", 10.0, id="new boot, Node Ready from the old boot: stale, wait"),
    pytest.param(rebooting(), Observations(node_error="refused", boot_id=NEW), 90, Action.WAIT,
                 RollReason.AWAITING_NODE, "cp-1", 10.0, id="new boot, API down (lone control plane): wait"),
    pytest.param(rebooting(), Observations(node=node(boot=NEW), boot_id=NEW, gate=closed("etcd not healthy")), 90,
                 Action.WAIT, RollReason.AWAITING_NODE, "cp-1", 10.0, id="new boot, Ready, verifier closed: wait"),
    pytest.param(rebooting(), Observations(node=node(boot=NEW), boot_id=NEW, gate=closed("etcd not healthy")), 1300,
                 Action.TIME_OUT, RollReason.NODE_TIMED_OUT, "cp-1", 30.0, id="verifier closed past the bound: pause"),
    pytest.param(rebooting(), Observations(node=node(boot=NEW), boot_id=NEW), 90, Action.COMPLETE,
                 RollReason.NODE_REBOOTED, "cp-1", 0.0, id="new boot, Ready on it, verified: complete"),
    pytest.param(rebooting(), Observations(node=node(boot=""), boot_id=NEW), 5000, Action.COMPLETE,
                 RollReason.NODE_REBOOTED, "cp-1", 0.0, id="back even past the bound: complete (no pause)"),
    pytest.param(rebooting(), Observations(node=node(boot=NEW), boot_id=NEW, gate=failed("runs another config")), 90,
                 Action.GIVE_UP, RollReason.VERIFY_FAILED, "cp-1", 30.0, id="back, a verifier failed for good: pause"),
    pytest.param(rebooting(), Observations(node=node(boot=NEW), boot_id=NEW, gate=failed("x")), 5000,
                 Action.GIVE_UP, RollReason.VERIFY_FAILED, "cp-1", 30.0, id="failed for good past the bound: same"),
    pytest.param(rebooting(), Observations(node=node(ready=False, boot=NEW), boot_id=NEW, gate=failed("x")), 90,
                 Action.WAIT, RollReason.AWAITING_NODE, "cp-1", 10.0, id="a final verdict counts only once back"),
    pytest.param(RollMarker(), Observations(node=node(), gate=failed("x")), 0, Action.BLOCK, RollReason.GATE_CLOSED,
                 "cp-1", 30.0, id="a final gate before the reboot is an ordinary closed gate"),
    pytest.param(rebooting("cp-9"), Observations(), 0, Action.BLOCK, RollReason.UNKNOWN_MACHINE, None, 30.0,
                 id="marker names a machine not in the plan"),
    pytest.param(RollMarker("cp-2", OLD, None), Observations(node=node("node-2"), boot_id=OLD), 0, Action.ASK_AGAIN,
                 RollReason.REBOOT_REQUESTED_AGAIN, "cp-2", 0.0, id="marker without a time, same boot: ask again"),
    pytest.param(RollMarker("cp-2", OLD, None), Observations(boot_error="refused"), 0, Action.TIME_OUT,
                 RollReason.NODE_TIMED_OUT, "cp-2", 30.0, id="marker without a time, silent: pause"),
]


@pytest.mark.parametrize(("marker", "obs", "seconds", "action", "reason", "machine", "after"), ROWS)
def test_decide(marker: RollMarker, obs: Observations, seconds: float, action: Action, reason: RollReason,
                machine: str | None, after: float) -> None:
    d = decide(PLAN, marker, obs, at(seconds), TIMING)
    assert (d.action, d.reason, d.target.machine if d.target else None) == (action, reason, machine)
    assert d.after == pytest.approx(after)
    assert d.message


def test_a_closed_gate_is_named_in_the_message() -> None:
    d = decide(PLAN, RollMarker(), Observations(node=node(), gate=closed("etcd on cp-2 has an alarm")), T0, TIMING)
    assert d.message == "waiting to reboot cp-1: etcd on cp-2 has an alarm"


def test_the_timeout_message_names_the_node_and_what_was_missing() -> None:
    d = decide(PLAN, rebooting(), Observations(node=node(ready=False), boot_id=NEW), at(1200), TIMING)
    assert "cp-1" in d.message and "Node node-1 is not Ready" in d.message


def test_bounds_follow_the_timing_scale() -> None:
    fast = TIMING.scaled(0.01)  # reboot_retry 3 s, bound 12 s
    obs = Observations(node=node(), boot_id=OLD)
    assert decide(PLAN, rebooting(), obs, at(2.9), fast).action is Action.WAIT
    assert decide(PLAN, rebooting(), obs, at(3.0), fast).action is Action.ASK_AGAIN
    silent = Observations(boot_error="refused")
    assert decide(PLAN, rebooting(), silent, at(11.9), fast).action is Action.WAIT
    assert decide(PLAN, rebooting(), silent, at(12.0), fast).action is Action.TIME_OUT


def test_next_target_prefers_the_marker_then_the_plan_order() -> None:
    assert next_target(PLAN, RollMarker(done=("cp-2",))) == PLAN[0]
    assert next_target(PLAN, RollMarker("cp-3", OLD, T0, ("cp-1",))) == PLAN[2]
    assert next_target(PLAN, RollMarker(done=("cp-3", "cp-1", "cp-2"))) is None


def test_marker_transitions() -> None:
    m = RollMarker(done=("cp-1",)).marked("cp-2", OLD, T0)
    assert (m.rebooting, m.boot_id, m.requested_at) == ("cp-2", OLD, T0)
    assert m.cleared() == RollMarker("", "", T0, ("cp-1",))
    assert m.finished("cp-2") == RollMarker("", "", T0, ("cp-1", "cp-2"))
    assert m.finished("cp-2").finished("cp-2").done == ("cp-1", "cp-2")  # append-only, once


def test_marker_round_trips_through_status_and_clears_with_null() -> None:
    marker = RollMarker("cp-2", OLD, T0 + timedelta(microseconds=123456), ("cp-1",))
    status = status_with_marker({"phase": "InProgress", "caRotation": {"stage": "Accepting"}}, marker)
    assert status["caRotation"] == {"stage": "Accepting", "etcdRebooting": "cp-2", "etcdRebootBootID": OLD,
                                    "etcdRestartedAt": "2026-12-01T12:00:00.123456Z", "etcdRestarted": ["cp-1"]}
    assert marker_from_status(status) == marker
    cleared = status_with_marker(status, marker.cleared())
    assert cleared["caRotation"]["etcdRebooting"] is None and cleared["caRotation"]["etcdRebootBootID"] is None
    assert marker_from_status(cleared) == marker.cleared()
    other = MarkerFields(section="rollout", rebooting="machine", boot_id="bootID", requested_at="at", done="done")
    assert marker_from_status(status_with_marker({}, marker, other), other) == marker


def test_node_view_reads_the_cordon_annotation_and_the_kubelet_boot() -> None:
    obj = {"metadata": {"name": "n", "resourceVersion": "3", "annotations": {CORDONED_BY_ICHORD_ANNOTATION: "true"}},
           "spec": {"unschedulable": True},
           "status": {"nodeInfo": {"bootID": NEW}, "conditions": [{"type": "Ready", "status": "True"}]}}
    assert NodeView.of(obj) == NodeView("n", "3", True, NEW, True, True)
    assert NodeView.of({"metadata": {"name": "n"}}) == NodeView("n", "", False, "", False, False)
