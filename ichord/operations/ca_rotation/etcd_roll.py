"""The etcd roll of a pass: reboot the control planes one at a time so etcd loads the stage's CA bundle.

docs/decisions.md#etcd-reboot-roll: an etcd member reads its CA only when it starts, Talos refuses
ServiceRestart("etcd"), so after each pass's applies every control plane is rebooted, in order, with
the backbone's roll (``ichord.operations.roll``). This module binds the roll to the rotation:

    plan        the approved control planes, in the order the passes visit them
    marker      status.caRotation.etcdRebooting / etcdRebootBootID / etcdRestartedAt / etcdRestarted
                (roll_store's default fields); etcdRestarted is emptied on every stage change
    gate        before each reboot and (as the verifier) once the node is back: etcd whole on every
                control plane (managed.etcd_health), the node's etcd PKI the stage's (etcd_pki), every Node Ready
    hook        a leader forfeits etcd leadership before its Reboot call (best effort)
    outcome     InProgress RebootingEtcd while a node reboots; Event EtcdMemberRebooted per node; a
                closed gate waits within ca_pass_wait_bound, a fault (alarm, foreign member, wrong
                PKI) or a node past nodeActionTimeout pauses (Blocked) naming it

The pass stage's steps (status.caRotation.step) become apply -> roll -> verify when etcd is a target;
verification of the stage starts only after the last member, and before it every leaf (server, peer,
kube-apiserver client) is checked against the stage's issuing etcd CA by signature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.conditions import parse_time
from ichord.api.names import CARotationReason, EventReason
from ichord.api.views import MachineView
from ichord.kube import crds
from ichord.kube import nodes as kube_nodes
from ichord.kube.client import KubeClient
from ichord.kube.nodes import NodeView
from ichord.operations import backbone, gates
from ichord.operations.ca_rotation.etcd_pki import ExpectedPKI, expected_pki, pki_problem
from ichord.operations.ca_rotation.managed_objects import not_ready_nodes
from ichord.operations.ca_rotation.passes import kubernetes_cas
from ichord.operations.ca_rotation.plan import verify_dial
from ichord.operations.ca_rotation.status import (
    CA_ROTATION,
    VERIFY_STEP,
    blocked,
    ca_status,
    event,
    in_progress,
    step,
    step_since,
    write,
)
from ichord.operations.managed.clients import ManagedAPIError, ManagedClients, cluster_client
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.etcd_health import Problem, etcd_problems
from ichord.operations.managed.inputs import Inputs
from ichord.operations.outcome import Outcome, Requeue
from ichord.operations.roll import (
    OPEN,
    GateResult,
    RollHooks,
    RollOutcome,
    RollReason,
    RollTarget,
    TalosNodes,
    advance_roll,
    closed,
    failed,
)
from ichord.operations.roll_store import StatusMarkerStore
from ichord.operations.windows import Closed
from ichord.pki.rotation import Target
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosError

log = structlog.get_logger("ichord.operations.ca_rotation")

#: The pass step between apply and verify while etcd is a target.
ROLL_STEP = "roll"
#: How many problems a closed gate names (the rest are counted).
SHOWN = 3


def rolls(targets: Iterable[Target]) -> bool:
    """Some target is loaded only at boot (its description's reboot_roll: the etcd CA)."""
    return any(t.description.reboot_roll for t in targets)


def rolling(inputs: Inputs) -> bool:
    """The pass is in its roll: the step says so, or a reboot is outstanding (the marker wins over the step)."""
    ca = ca_status(inputs)
    return ca.get("step") == ROLL_STEP or bool(ca.get("etcdRebooting"))


def rolled(inputs: Inputs) -> bool:
    """Every approved control plane was rebooted in this pass (the roll's done list, per stage)."""
    done = set(ca_status(inputs).get("etcdRestarted") or [])
    return bool(inputs.control_planes) and all(m.name in done for m in inputs.control_planes)


def node_name(m: MachineView) -> str:
    """The machine's Kubernetes Node: its hostname, else the name the machine controller read, else its own."""
    return m.hostname or str(m.status.get("nodeName") or "") or m.name


def roll_plan(control_planes: Sequence[MachineView]) -> list[RollTarget]:
    return [RollTarget(m.name, m.address, node_name(m)) for m in control_planes]


class ManagedAPI:
    """The managed cluster's Nodes through the admin kubeconfig a control plane issues, opened on first use (a
    step that only waits on a rebooting node never asks for one). Errors are ManagedAPIErrors (IchordErrors).

    With ``clients`` (the daemon's, kept across steps) the cluster's client is the one the stage's verification
    and gates use (``issued_in``: the stage): a roll step does not ask for a kubeconfig of its own. A request that
    fails while a control plane reboots leaves the client failing, and ManagedClients drops it when the step
    ends, so the next step asks again."""

    def __init__(self, talos: TalosClient, control_planes: Sequence[MachineView], cas: Sequence[bytes], *,
                 clients: ManagedClients | None = None, key: str = "", issued_in: str = "") -> None:
        self._talos = talos
        self._control_planes = control_planes
        self._cas = cas
        self._clients, self._key, self._issued_in = clients, key, issued_in
        self._stack = contextlib.AsyncExitStack()
        self._client: KubeClient | None = None

    async def client(self) -> KubeClient:
        if self._client is None:
            self._client = await self._stack.enter_async_context(
                cluster_client(self._clients, self._key, self._talos, self._control_planes, self._cas,
                               issued_in=self._issued_in))
        return self._client

    async def read(self, name: str) -> NodeView:
        return await kube_nodes.read_node_view(await self.client(), name)

    async def cordon(self, name: str) -> NodeView:
        return await kube_nodes.cordon(await self.client(), name)

    async def uncordon(self, name: str) -> bool:
        return await kube_nodes.uncordon(await self.client(), name)

    async def not_ready(self) -> list[str]:
        return await not_ready_nodes(await self.client())

    async def aclose(self) -> None:
        await self._stack.aclose()


class EtcdGate:
    """The gate (before a reboot) and the verifier (after it): etcd whole, the stage's PKI everywhere, Nodes Ready.

    ``faulted`` tells the caller whether the last closed answer was a fault (pause) or a wait; as a verifier a
    fault fails for good (the roll uncordons and pauses, keeping its marker)."""

    def __init__(self, talos: TalosClient, control_planes: Sequence[MachineView], expected: ExpectedPKI,
                 managed: ManagedAPI, *, verifier: bool = False) -> None:
        self._talos = talos
        self._control_planes = control_planes
        self._expected = expected
        self._managed = managed
        self._verifier = verifier
        self.faulted = False

    async def problems(self) -> list[Problem]:
        found = await etcd_problems(self._talos, self._control_planes)
        for cp in self._control_planes:
            try:
                problem = await pki_problem(self._talos, cp.name, cp.address, self._expected)
            except TalosError as exc:
                found.append(Problem(f"cannot read the etcd PKI of {cp.name}: {SCRUBBER.exception(exc)}"))
                continue
            if problem is not None:
                found.append(Problem(problem, fault=True))
        try:
            not_ready = await self._managed.not_ready()
        except ManagedAPIError as exc:
            found.append(Problem(str(exc)))
        else:
            if not_ready:
                found.append(Problem(f"Node(s) not Ready: {', '.join(not_ready)}"))
        return found

    async def __call__(self, target: RollTarget) -> GateResult:
        found = await self.problems()
        self.faulted = any(p.fault for p in found)
        if not found:
            return OPEN
        faults = [p for p in found if p.fault] or found
        text = "; ".join(p.text for p in faults[:SHOWN]) + (
            f" (and {len(faults) - SHOWN} more)" if len(faults) > SHOWN else "")
        return failed(text) if self._verifier and self.faulted else closed(text)


def leadership_hook(talos: TalosClient, members: int) -> RollHooks:
    """A leader hands leadership on before its reboot; a lone member has nobody to hand it to."""
    async def forfeit(target: RollTarget) -> None:
        if members < 2:
            return
        status = await talos.etcd_status(target.endpoint)
        if status.leader and status.leader == status.member_id:
            moved_to = await talos.etcd_forfeit_leadership(target.endpoint)
            log.info("etcd roll: leadership forfeited before the reboot", machine=target.machine, to=moved_to)

    return RollHooks(before_reboot_call=forfeit)


async def leaf_problems(talos: TalosClient, control_planes: Sequence[MachineView], expected: ExpectedPKI) -> list[str]:
    """Every control plane's etcd server, peer and kube-apiserver client certificates signed by the stage's CA."""
    out = []
    for cp in control_planes:
        try:
            problem = await pki_problem(talos, cp.name, cp.address, expected, every_leaf=True)
        except TalosError as exc:
            problem = f"cannot read the etcd certificates of {cp.name}: {SCRUBBER.exception(exc)}"
        if problem is not None:
            out.append(problem)
    return out


async def roll_step(ctx: StepContext, inputs: Inputs, stage: Stage) -> Outcome:
    """One step of the pass's etcd roll; when the last member is back and verified, the pass goes to verify."""
    rotation = inputs.rotation
    assert rotation is not None
    cps = inputs.control_planes
    expected = expected_pki(inputs.bundle, rotation, stage)
    talos = ctx.talos_factory(verify_dial(inputs.bundle, rotation, stage))
    managed = ManagedAPI(talos, cps, kubernetes_cas(inputs, rotation), clients=ctx.managed, key=inputs.cluster_key,
                         issued_in=stage.value)
    gate = EtcdGate(talos, cps, expected, managed)
    verifier = EtcdGate(talos, cps, expected, managed, verifier=True)
    store = StatusMarkerStore(crds.operations(ctx.kube), inputs.op_namespace, inputs.name)

    held: Outcome | None = None

    async def window(t: RollTarget) -> Closed | None:  # the next member reboots only inside a maintenance window
        nonlocal held
        closed_now = backbone.window_closed(ctx, inputs.cluster, f"the etcd reboot of {t.machine}",
                                            lambda: backbone.predicted_step(ctx, inputs.op, t.machine))
        if closed_now is not None:
            return closed_now
        # docs/decisions.md#health-gates: and only once the health gates pass (and the soak is over), asked before
        # each member starts (its cordon), never while one is in flight. The hold wrote its own status; the roll is
        # only told not to start the member.
        done = ca_status(inputs).get("etcdRestarted") or []
        held = await gates.hold(ctx, CA_ROTATION, inputs, inputs.cluster, gates.opening_probe(managed.client),
                                target=t.machine, first=not done)
        return None if held is None else Closed(f"{t.machine} waits for its health gates", 0.0)

    try:
        out = await advance_roll(roll_plan(cps), store, TalosNodes(talos, inputs.cluster_inputs.contract), managed,
                                 gates=[gate], verifiers=[verifier], hooks=leadership_hook(talos, len(cps)),
                                 timing=ctx.timing, clock=ctx.now, admit=window)
        leaves = await leaf_problems(talos, cps, expected) if out.finished else []
    finally:
        await managed.aclose()
        talos.close()
    if held is not None:
        return held
    if out.finished:
        if leaves:
            return await blocked(ctx, inputs, f"{stage.value}: every control plane rebooted, but " + "; ".join(leaves))
        message = (f"{stage.value}: every control plane rebooted on the stage's etcd CA "
                   f"({', '.join(out.done)}); verifying")
        await write(ctx, inputs, step(VERIFY_STEP, ctx.now()),
                    *in_progress(ctx, CARotationReason.VERIFYING_PASS, message))
        return Requeue(0.0, f"verify {stage.value}")
    return await _report(ctx, inputs, stage, out, gate)


def _since_progress(inputs: Inputs, ctx: StepContext) -> float:
    """Seconds since the roll last moved: its step began or the last reboot was asked for, whichever is later."""
    marks = [step_since(inputs.status, ROLL_STEP)]
    raw = ca_status(inputs).get("etcdRestartedAt")
    if raw:
        with contextlib.suppress(ValueError):
            marks.append(parse_time(str(raw)))
    known = [t for t in marks if t is not None]
    return max(0.0, (ctx.now() - max(known)).total_seconds()) if known else 0.0


async def _report(ctx: StepContext, inputs: Inputs, stage: Stage, out: RollOutcome, gate: EtcdGate) -> Outcome:
    """The roll's outcome as the operation shows it (InProgress RebootingEtcd, Blocked, or paused)."""
    total = len(inputs.control_planes)
    if out.pause:
        return await blocked(ctx, inputs, f"{stage.value}: {out.message}")
    if out.window is not None:
        return await backbone.wait_for_window(ctx, CA_ROTATION, inputs, out.window)
    if out.reason is RollReason.GATE_CLOSED:
        waited = _since_progress(inputs, ctx)
        bound = ctx.timing.ca_pass_wait_bound
        if gate.faulted or waited >= bound:
            extra = "" if gate.faulted else f" (waited more than {bound:g} s)"
            return await blocked(ctx, inputs, f"{stage.value}: {out.message}{extra}")
        await _show(ctx, inputs, f"{stage.value}: {out.message}")
        return Requeue(min(ctx.timing.ca_pass_verify_delay, bound - waited), "etcd gate")
    if not isinstance(out.outcome, Requeue):
        return await blocked(ctx, inputs, f"{stage.value}: {out.message}")
    if out.reason is RollReason.NODE_REBOOTED:
        message = (f"{stage.value}: {out.machine} rebooted and etcd is whole again "
                   f"({len(out.done)}/{total} control planes)")
        await _show(ctx, inputs, message)
        event(ctx, inputs, "Normal", EventReason.ETCD_MEMBER_REBOOTED, message)
        return out.outcome
    await _show(ctx, inputs, f"{stage.value}: {out.message} ({len(out.done)}/{total} control planes rebooted)")
    return out.outcome


async def _show(ctx: StepContext, inputs: Inputs, message: str) -> None:
    cond: dict[str, Any] = next((c for c in inputs.status.get("conditions") or []
                                 if c.get("type") == names.CA_ROTATION), {})
    if (cond.get("reason"), cond.get("message")) == (CARotationReason.REBOOTING_ETCD, SCRUBBER.text(message)) \
            and ca_status(inputs).get("step") == ROLL_STEP:
        return  # nothing new to say: no write per poll
    await write(ctx, inputs, step(ROLL_STEP, ctx.now()), *in_progress(ctx, CARotationReason.REBOOTING_ETCD, message))
