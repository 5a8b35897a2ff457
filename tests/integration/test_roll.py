"""The reboot roll (ichord/operations/roll.py) on a simulated 3+1 cluster: Talos nodes over mutual TLS, the
managed cluster's Nodes over HTTPS, the marker on a TalosOperation's status. What happened is read from the
Talos simulator's history (reboot requests, reboots, refusals) and from the Nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from ichord.contract import V1_14
from ichord.errors import IchordError
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION, NodeView, read_node_view
from ichord.operations.roll import (
    OPEN,
    GateResult,
    HookResult,
    HookVerdict,
    KubeNodes,
    RollHooks,
    RollReason,
    RollTalos,
    RollTarget,
    restart_clock,
)
from ichord.operations.roll_state import closed, failed
from ichord.operations.windows import Closed
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from tests.integration._roll_helpers import MovableClock, Roll, control_plane_plan, create_operation

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SIM_SCALE = 0.02  # a simulated reboot takes 40 ms
TIMING = Timing().scaled(0.01)  # retry 0.3 s, reboot_retry 3 s, node_action_timeout 12 s, poll 0.1 s
CPS = ["demo-cp-1", "demo-cp-2", "demo-cp-3"]


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SIM_SCALE, control_planes=3, workers=1) as e:
        yield e


@pytest.fixture
async def kc(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    # management_api="self": ichord's objects and the managed cluster's Nodes are on one API server.
    c = await from_kubeconfig(env.kubeconfig, timing=Timing())  # unscaled: a 0.3 s call bound is too tight
    yield c
    await c.close()


@pytest.fixture
async def talos(bundle: SecretsBundle) -> AsyncIterator[TalosClient]:
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as c:
        yield c


@pytest.fixture
async def roll(env: SimEnvironment, kc: KubeClient, talos: TalosClient) -> Roll:
    store = await create_operation(kc, env.namespace, env.cluster_name)
    nodenames = {m: env.node(m).nodename for m in env.machine_names}
    plan = control_plane_plan(env.machines, env.endpoints, nodenames)
    assert [t.machine for t in plan] == CPS
    return Roll(plan, store, talos, kc, V1_14, TIMING, clock=MovableClock())


def requested(env: SimEnvironment, machine: str) -> list[dict[str, object]]:
    return env.talos.history.of("reboot_requested", env.node(machine).name)


def reboots(env: SimEnvironment) -> dict[str, int]:
    return {m: len(env.talos.history.of("reboot", env.node(m).name)) for m in env.machine_names}


async def nodes_of(kc: KubeClient, env: SimEnvironment) -> dict[str, NodeView]:
    return {m: await read_node_view(kc, env.node(m).nodename) for m in env.machine_names}


async def assert_none_cordoned(kc: KubeClient, env: SimEnvironment) -> None:
    for machine, node in (await nodes_of(kc, env)).items():
        assert not node.unschedulable and not node.cordoned_by_ichord, machine


async def test_a_roll_reboots_every_control_plane_once_in_order_cordoned_and_uncordoned(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    seen: list[tuple[str, NodeView]] = []

    async def note_cordon(target: RollTarget) -> HookResult:
        seen.append((target.machine, await KubeNodes(kc).read(target.node)))
        return HookResult()

    roll.hooks = RollHooks(before_reboot=note_cordon)
    out = await roll.to_done()
    assert out.finished and out.reason is RollReason.DONE and out.done == tuple(CPS)
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    # One at a time: each control plane was asked only after the previous one was back (its reboot recorded).
    events = [e for e in env.talos.history.events if e["kind"] in ("reboot_requested", "reboot")]
    assert [(e["kind"], e["node"]) for e in events] == [(k, env.node(m).name) for m in CPS
                                                       for k in ("reboot_requested", "reboot")]
    assert all(view.unschedulable and view.cordoned_by_ichord for _, view in seen)
    assert [m for m, _ in seen] == CPS
    await assert_none_cordoned(kc, env)
    marker = await roll.store.read()
    assert (marker.rebooting, marker.boot_id, marker.done) == ("", "", tuple(CPS))
    # Done is level-triggered: another step changes nothing.
    assert (await roll.step()).finished and reboots(env)["demo-cp-1"] == 1


async def test_the_step_that_cordons_drains_and_asks_for_the_reboot_after_reading_again(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    """A cordon does not end the step: the node and the gates are read again (as a next step would) and the
    drain and the reboot follow at once; a gate that closes in between still holds the node, cordoned."""
    asked: list[str] = []
    close_at = [2]  # the gate closes on its second reading only

    async def gate(target: RollTarget) -> GateResult:
        asked.append(target.machine)
        return closed("etcd lost its leader") if len(asked) in close_at else OPEN

    roll.gates = [gate]
    out = await roll.step()
    assert (out.reason, out.machine) == (RollReason.GATE_CLOSED, "demo-cp-1")  # the second reading closed
    assert asked == ["demo-cp-1", "demo-cp-1"] and requested(env, "demo-cp-1") == []
    assert (await read_node_view(kc, env.node("demo-cp-1").nodename)).cordoned_by_ichord  # kept, as the table says
    out = await roll.step()  # open again: cordoned already, so the reboot is asked at once
    assert (out.reason, out.machine) == (RollReason.REBOOTING, "demo-cp-1") and len(requested(env, "demo-cp-1")) == 1
    out = await roll.until(lambda o: o.reason is RollReason.NODE_REBOOTED)
    asked.clear()
    close_at.clear()
    out = await roll.step()  # the next control plane: cordoned and asked to reboot in one step
    assert (out.reason, out.machine) == (RollReason.REBOOTING, "demo-cp-2") and len(requested(env, "demo-cp-2")) == 1
    assert asked == ["demo-cp-2", "demo-cp-2"]


async def test_a_closed_gate_blocks_before_anything_is_touched_then_the_roll_goes_on(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    why = {"demo-cp-2": "etcd on demo-cp-3 reports an alarm"}

    async def etcd_gate(target: RollTarget) -> GateResult:
        return closed(why[target.machine]) if target.machine in why else OPEN

    roll.gates = [etcd_gate]
    out = await roll.until(lambda o: o.reason is RollReason.GATE_CLOSED)
    assert out.machine == "demo-cp-2" and out.outcome.retry_after == TIMING.retry  # type: ignore[union-attr]
    assert out.message == "waiting to reboot demo-cp-2: etcd on demo-cp-3 reports an alarm"
    for _ in range(3):  # it stays blocked, and demo-cp-2 is neither cordoned nor rebooted
        assert (await roll.step()).reason is RollReason.GATE_CLOSED
    assert requested(env, "demo-cp-2") == []
    assert not (await read_node_view(kc, env.node("demo-cp-2").nodename)).unschedulable
    why.clear()
    assert (await roll.to_done()).finished
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    await assert_none_cordoned(kc, env)


async def test_a_refused_reboot_clears_the_marker_uncordons_and_is_retried(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    env.node("demo-cp-2").faults.reboot_error = "failed to acquire lock: sequence is already running"
    out = await roll.until(lambda o: o.reason is RollReason.REBOOT_FAILED)
    assert out.machine == "demo-cp-2" and "sequence is already running" in out.message
    marker = await roll.store.read()
    assert (marker.rebooting, marker.boot_id, marker.done) == ("", "", ("demo-cp-1",))
    node = await read_node_view(kc, env.node("demo-cp-2").nodename)
    assert not node.unschedulable and not node.cordoned_by_ichord
    assert len(env.talos.history.of("reboot_refused", env.node("demo-cp-2").name)) == 1
    env.node("demo-cp-2").faults.reboot_error = None
    assert (await roll.to_done()).finished
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    await assert_none_cordoned(kc, env)


async def test_a_node_that_never_comes_back_pauses_the_roll_naming_it(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    clock = roll.clock
    assert isinstance(clock, MovableClock)
    out = await roll.until(lambda o: o.reason is RollReason.REBOOTING and o.machine == "demo-cp-1")
    env.node("demo-cp-1").faults.unreachable = True  # it goes down for the reboot and stays down
    out = await roll.until(lambda o: not env.node("demo-cp-1").up)
    out = await roll.step()
    assert (out.reason, out.pause) == (RollReason.REBOOTING, False)
    clock.advance(TIMING.node_action_timeout)
    out = await roll.step()
    assert (out.reason, out.pause, out.machine) == (RollReason.NODE_TIMED_OUT, True, "demo-cp-1")
    assert "demo-cp-1 did not come back within 12 s" in out.message
    assert "does not answer" in out.message
    assert [len(requested(env, m)) for m in CPS] == [1, 0, 0]  # nothing else rebooted meanwhile
    assert (await roll.step()).pause  # still paused: a marker is never forgotten

    await env.node("demo-cp-1").set_unreachable(False)
    assert await restart_clock(roll.store, clock)  # a person resumes the paused operation: a fresh bound
    out = await roll.to_done()
    assert out.finished and reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    await assert_none_cordoned(kc, env)


async def test_the_same_boot_id_after_reboot_retry_asks_again_in_one_step_keeping_the_marker(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    clock = roll.clock
    assert isinstance(clock, MovableClock)
    env.node("demo-cp-1").faults.reboot_never_happens = True
    await roll.until(lambda o: o.reason is RollReason.REBOOTING)
    boot = env.node("demo-cp-1").boot_id
    first = (await roll.store.read()).requested_at
    for _ in range(3):  # within reboot_retry: wait, never a second request
        assert (await roll.step()).reason is RollReason.REBOOTING
    assert len(requested(env, "demo-cp-1")) == 1
    env.node("demo-cp-1").faults.reboot_never_happens = False
    clock.advance(TIMING.reboot_retry)
    out = await roll.step()  # up, running, still on its boot: asked again, the marker kept with the new request's time
    assert (out.reason, out.machine) == (RollReason.REBOOT_REQUESTED_AGAIN, "demo-cp-1")
    assert out.message == f"asked demo-cp-1 again to reboot: it still ran boot {boot} 3 s after the first request"
    marker = await roll.store.read()
    assert (marker.rebooting, marker.boot_id) == ("demo-cp-1", boot)
    assert first is not None and marker.requested_at is not None and marker.requested_at > first
    assert (await roll.to_done()).finished
    asked = requested(env, "demo-cp-1")
    assert [(e["boot_id"], e["happens"]) for e in asked] == [(boot, False), (boot, True)]
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    await assert_none_cordoned(kc, env)


class _Interleaved:
    """The step's Talos port (the real one) with the simulator moved on right after the boot ID it read: the node
    ends its shutdown then, and the port answers the old boot ID once the node is ``where`` ("down", or "back" on a
    new boot). Forces what a loaded machine did by chance: the step's later reads see another node than the first."""

    def __init__(self, inner: RollTalos, env: SimEnvironment, machine: str, where: str) -> None:
        self.inner, self.env, self.machine, self.where = inner, env, machine, where
        self.armed = True

    async def boot_id(self, target: RollTarget) -> str:
        answer = await self.inner.boot_id(target)
        if self.armed and target.machine == self.machine:
            self.armed = False
            node = self.env.node(self.machine)
            there = anyio.Event()
            wanted = "down" if self.where == "down" else "up"  # "up": back on its new boot, answering

            def listener(event: dict[str, object]) -> None:
                if event["kind"] == wanted and event.get("node") == node.name:
                    there.set()

            self.env.talos.history.listeners.append(listener)
            try:
                node.end_shutdown()
                with anyio.fail_after(30):
                    await there.wait()
            finally:
                self.env.talos.history.listeners.remove(listener)
        return answer

    async def reboot(self, target: RollTarget) -> None:
        await self.inner.reboot(target)

    async def shutting_down(self, target: RollTarget) -> bool:
        return await self.inner.shutting_down(target)


@pytest.mark.parametrize("where", ["down", "back"])
async def test_a_node_that_moves_between_the_steps_reads_past_reboot_retry_is_not_asked_again(
        env: SimEnvironment, kc: KubeClient, roll: Roll, where: str) -> None:
    """The step read the old boot ID past reboot_retry, then the node finished its shutdown: its stage read fails
    (down) or says running on a new boot (back). The reboot was seen: it is waited for, never asked a second time."""
    clock = roll.clock
    assert isinstance(clock, MovableClock)
    env.talos.timings.reboot_shutdown = 600.0  # held in its shutdown until the port lets it go
    roll.plan = roll.plan[:1]
    await roll.until(lambda o: o.reason is RollReason.REBOOTING)
    boot = env.node("demo-cp-1").boot_id
    clock.advance(TIMING.reboot_retry)
    roll.wrap_talos = lambda inner: _Interleaved(inner, env, "demo-cp-1", where)
    out = await roll.step()
    assert out.reason in (RollReason.REBOOTING, RollReason.AWAITING_NODE), out
    assert (await roll.store.read()).boot_id == boot  # the marker stays on the boot it left
    roll.wrap_talos = None
    assert (await roll.to_done()).finished
    assert [e["boot_id"] for e in requested(env, "demo-cp-1")] == [boot]
    assert reboots(env)["demo-cp-1"] == 1
    await assert_none_cordoned(kc, env)


async def test_a_lost_reboot_answer_keeps_the_marker_and_the_node_is_rebooted_once(
        env: SimEnvironment, bundle: SecretsBundle, roll: Roll) -> None:
    # The node takes longer than the RPC deadline to answer Reboot, but reboots: the roll must wait, not ask again.
    node = env.node("demo-cp-1")

    async def slow_down(target: RollTarget) -> None:
        node.faults.slow = 0.6

    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=0.3) as impatient:
        roll.talos = impatient
        roll.hooks = RollHooks(before_reboot_call=slow_down)
        out = await roll.until(lambda o: o.reason is RollReason.REBOOTING)
        assert "no answer" in out.message and out.machine == "demo-cp-1"
        assert (await roll.store.read()).rebooting == "demo-cp-1"
        node.faults.slow = 0.0
        roll.hooks = None
        await roll.until(lambda o: o.reason is RollReason.NODE_REBOOTED)
    assert len(requested(env, "demo-cp-1")) == 1 and reboots(env)["demo-cp-1"] == 1


async def test_a_node_cordoned_by_a_person_is_rebooted_but_left_cordoned(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    name = env.node("demo-cp-2").nodename
    await kc.raw("PATCH", f"/api/v1/nodes/{name}", body={"spec": {"unschedulable": True}},
                 content_type="application/merge-patch+json")
    assert (await roll.to_done()).finished
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    views = await nodes_of(kc, env)
    assert views["demo-cp-2"].unschedulable and not views["demo-cp-2"].cordoned_by_ichord
    assert all(not v.unschedulable for m, v in views.items() if m != "demo-cp-2")
    assert all(CORDONED_BY_ICHORD_ANNOTATION not in str(v) for v in views.values())


async def test_a_drain_that_gives_up_uncordons_and_pauses_without_a_reboot(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    async def drain(target: RollTarget) -> HookResult:
        if target.machine == "demo-cp-1":
            return HookResult(HookVerdict.GIVE_UP, "pod db-0 has no controller")
        return HookResult()

    roll.hooks = RollHooks(before_reboot=drain)
    out = await roll.to_done()
    assert (out.reason, out.pause, out.machine) == (RollReason.DRAIN_FAILED, True, "demo-cp-1")
    assert "pod db-0 has no controller" in out.message
    assert requested(env, "demo-cp-1") == []
    await assert_none_cordoned(kc, env)


async def test_drain_waits_verifiers_hold_the_node_and_a_failing_forfeit_does_not_stop_the_reboot(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    drains: dict[str, int] = {}
    verified: list[str] = []
    etcd_back = {"value": False}

    async def drain(target: RollTarget) -> HookResult:
        drains[target.machine] = drains.get(target.machine, 0) + 1
        if drains[target.machine] < 3:
            return HookResult(HookVerdict.WAIT, f"evicting 2 pods from {target.node}", after=0.01)
        return HookResult()

    async def forfeit(target: RollTarget) -> None:
        raise IchordError("etcd forfeit leadership failed: no leader")

    async def etcd_healthy(target: RollTarget) -> GateResult:
        return OPEN if etcd_back["value"] else closed(f"etcd on {target.machine} is not healthy yet")

    async def after(target: RollTarget) -> None:
        verified.append(target.machine)

    roll.plan = roll.plan[:1]
    roll.hooks = RollHooks(before_reboot=drain, before_reboot_call=forfeit, after_reboot_verified=after)
    roll.verifiers = [etcd_healthy]
    out = await roll.until(lambda o: o.reason is RollReason.DRAINING)
    assert out.message == "evicting 2 pods from demo-cp-1" and requested(env, "demo-cp-1") == []
    out = await roll.until(lambda o: o.reason is RollReason.AWAITING_NODE and "etcd" in o.message)
    assert out.message == "waiting for demo-cp-1: etcd on demo-cp-1 is not healthy yet"
    assert drains == {"demo-cp-1": 3} and verified == [] and reboots(env)["demo-cp-1"] == 1
    assert (await read_node_view(kc, env.node("demo-cp-1").nodename)).cordoned_by_ichord  # held until verified
    etcd_back["value"] = True
    out = await roll.to_done()
    assert out.finished and out.done == ("demo-cp-1",) and verified == ["demo-cp-1"]
    await assert_none_cordoned(kc, env)


async def test_a_node_back_with_a_failed_verification_is_uncordoned_and_paused_never_rebooted_again(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    verdict = {"demo-cp-2": failed("it runs configuration 1a2b, not the rendered 3c4d")}

    async def runs_rendered(target: RollTarget) -> GateResult:
        return verdict.get(target.machine, OPEN)

    roll.verifiers = [runs_rendered]
    out = await roll.to_done()
    assert (out.reason, out.pause, out.machine) == (RollReason.VERIFY_FAILED, True, "demo-cp-2")
    assert "runs configuration 1a2b" in out.message
    marker = await roll.store.read()
    assert (marker.rebooting, marker.done) == ("demo-cp-2", ("demo-cp-1",))  # kept: resume verifies, never reboots
    await assert_none_cordoned(kc, env)
    verdict.clear()  # fixed by a person; the operation is resumed
    assert await restart_clock(roll.store, roll.clock)
    assert (await roll.to_done()).finished
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    await assert_none_cordoned(kc, env)


async def test_a_node_still_shutting_down_past_reboot_retry_is_waited_for_not_asked_again(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    # A graceful reboot stops pods and services before the node goes down; apid answers meanwhile with the
    # old boot ID and stage REBOOTING. Asking again then would reboot it twice (the simulator would do it).
    clock = roll.clock
    assert isinstance(clock, MovableClock)
    env.talos.timings.reboot_shutdown = 600.0  # held in its shutdown until the test lets it go, however slow the step
    roll.plan = roll.plan[:1]
    await roll.until(lambda o: o.reason is RollReason.REBOOTING)
    clock.advance(TIMING.reboot_retry)
    out = await roll.step()
    assert (out.reason, out.message) == (RollReason.REBOOTING, "waiting for demo-cp-1: Talos reports it rebooting")
    env.node("demo-cp-1").end_shutdown()
    assert (await roll.to_done()).finished
    assert len(requested(env, "demo-cp-1")) == 1 and reboots(env)["demo-cp-1"] == 1
    await assert_none_cordoned(kc, env)


async def test_outside_a_window_no_node_is_started_but_the_one_in_flight_finishes(
        env: SimEnvironment, kc: KubeClient, roll: Roll) -> None:
    """docs/decisions.md#maintenance-windows: ``admit`` is asked only before a node's first disruptive call. A node
    ichord cordoned is in flight and goes on when the window closes; the next one, and one a person cordoned, wait
    with nothing done to them."""
    window = {"open": True}
    asked: list[str] = []

    async def admit(target: RollTarget) -> Closed | None:
        asked.append(target.machine)
        return None if window["open"] else Closed(f"waiting for the window to start {target.machine}", 42.0)

    roll.admit = admit
    name = env.node("demo-cp-1").nodename
    await kc.raw("PATCH", f"/api/v1/nodes/{name}", body={"metadata": {"annotations": {
        CORDONED_BY_ICHORD_ANNOTATION: "true"}}, "spec": {"unschedulable": True}},
                 content_type="application/merge-patch+json")  # as a step killed right after its cordon left it
    window["open"] = False
    out = await roll.until(lambda o: o.reason is RollReason.NODE_REBOOTED)  # in flight: it finishes
    assert out.machine == "demo-cp-1" and asked == [] and len(requested(env, "demo-cp-1")) == 1
    out = await roll.step()  # the next one is not started
    assert (out.reason, out.machine, out.outcome.after) == (  # type: ignore[union-attr]
        RollReason.WAITING_FOR_WINDOW, "demo-cp-2", 42.0)
    assert out.window is not None and out.message == "waiting for the window to start demo-cp-2"
    assert requested(env, "demo-cp-2") == [] and not (await read_node_view(
        kc, env.node("demo-cp-2").nodename)).unschedulable
    person = env.node("demo-cp-2").nodename  # a person's cordon is not ichord's start: it waits all the same
    await kc.raw("PATCH", f"/api/v1/nodes/{person}", body={"spec": {"unschedulable": True}},
                 content_type="application/merge-patch+json")
    assert (await roll.step()).reason is RollReason.WAITING_FOR_WINDOW and requested(env, "demo-cp-2") == []
    window["open"] = True
    assert (await roll.to_done()).finished
    assert reboots(env) == {**dict.fromkeys(CPS, 1), "demo-worker-1": 0}
    assert asked == ["demo-cp-2", "demo-cp-2", "demo-cp-2", "demo-cp-3"]
