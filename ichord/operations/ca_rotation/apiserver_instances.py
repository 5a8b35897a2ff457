"""One kube-apiserver restart at a time (docs/decisions.md#ca-rotation-passes point 3;
docs/decisions.md#config-rollout's restart amendment).

A pass that rotates the Kubernetes or the aggregator CA restarts kube-apiserver on every control plane it
applies to, some seconds after the apply. Before each such apply the pass records the control plane's
kube-apiserver container ID and the time (``status.caRotation.apiServerInstances``: machine, containerID,
appliedAt; written before the apply, so a controller killed in between applies again and records afresh; emptied
on every stage change). After it, neither the next control plane is applied nor the stage verified until that
node runs another container and its own ``/readyz`` (``https://<node>:<localAPIServerPort>/readyz``,
anonymous, trusting the old and the new Kubernetes CA) answers 200. A container unchanged for
``Timing.ca_apiserver_unchanged`` after the apply counts as not restarted (the stage changed nothing it loads): then
only /readyz is asked, as for a control plane with no record. Past ``ca_apiserver_ready_bound`` it is Blocked.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ichord.api import names
from ichord.api.conditions import find, now_rfc3339, parse_time
from ichord.api.names import CARotationReason
from ichord.api.views import MachineView
from ichord.failpoints import failpoint
from ichord.operations.backbone import Mutation
from ichord.operations.ca_rotation.status import APPLY_STEP, VERIFY_STEP, ca_status, in_progress, step_since, write
from ichord.operations.managed import apiserver_restart
from ichord.operations.managed.context import Obj, StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.managed.readyz import node_host, readyz
from ichord.operations.outcome import Requeue
from ichord.pki.rotation import Target
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosError

FIELD = "apiServerInstances"


def restarts_apiserver(targets: Iterable[Target]) -> bool:
    """A pass of these targets re-renders what kube-apiserver loads on every control plane: its CAs, and
    for etcd its etcd client CA, which Talos restarts the static pod for too (docs/decisions.md#etcd-reboot-roll)."""
    return any(t.description.restarts_apiserver for t in targets)


@dataclass(frozen=True)
class Instance:
    machine: str
    container_id: str
    applied_at: dt.datetime


def recorded(ca_status: Obj) -> dict[str, Instance]:
    out: dict[str, Instance] = {}
    for entry in ca_status.get(FIELD) or []:
        try:
            out[str(entry["machine"])] = Instance(str(entry["machine"]), str(entry.get("containerID") or ""),
                                                  parse_time(str(entry["appliedAt"])))
        except (KeyError, ValueError):
            continue  # a malformed entry is as good as none: only /readyz is asked
    return out


def _record(machine: str, container_id: str, now: dt.datetime) -> Mutation:
    stamp = now_rfc3339(now)

    def m(status: Obj) -> None:
        ca = status.setdefault("caRotation", {})
        rest = [e for e in ca.get(FIELD) or [] if e.get("machine") != machine]
        ca[FIELD] = [*rest, {"machine": machine, "containerID": container_id, "appliedAt": stamp}]

    return m


async def record_before_apply(ctx: StepContext, inputs: Inputs, talos: TalosClient, m: MachineView) -> None:
    """Written before the apply (kill-safe); an unreadable container ID is recorded as "" (only /readyz asked)."""
    try:
        current = (await apiserver_restart.running_apiserver(talos, m.address)).container_id
    except TalosError:
        current = ""
    await write(ctx, inputs, _record(m.name, current, ctx.now()))
    failpoint("ca-rotation.apiserver.recorded")


@dataclass(frozen=True)
class Awaited:
    """What a control plane's kube-apiserver is still awaited for; ``overdue`` past the bound (Blocked)."""

    message: str
    overdue: bool


async def awaited(ctx: StepContext, inputs: Inputs, talos: TalosClient, m: MachineView,
                  cas: Sequence[bytes], *, restarted: bool = False) -> Awaited | None:
    """None once ``m``'s kube-apiserver restarted (or was given the minute) and answers /readyz.

    ``restarted``: the pass already saw the new container (a restart is not undone), so only /readyz is asked."""
    inst = recorded(ca_status(inputs)).get(m.name)
    now = ctx.now()
    # Without a record (an older controller applied it) the bound runs from when the pass's step began.
    since = inst.applied_at if inst is not None else (
        step_since(inputs.status, VERIFY_STEP) or step_since(inputs.status, APPLY_STEP) or now)
    elapsed = (now - since).total_seconds()
    unchanged_after, bound = ctx.timing.ca_apiserver_unchanged, ctx.timing.ca_apiserver_ready_bound
    overdue = elapsed >= bound
    if not restarted and inst is not None and inst.container_id and elapsed < unchanged_after:
        try:
            now_running = (await apiserver_restart.running_apiserver(talos, m.address)).container_id
        except TalosError as exc:
            return Awaited(f"kube-apiserver on {m.name}: its container cannot be read yet "
                           f"({SCRUBBER.exception(exc)})", overdue)
        if not apiserver_restart.restarted(inst.container_id, now_running, elapsed=elapsed,
                                           unchanged_after=unchanged_after):
            return Awaited(f"waiting for kube-apiserver on {m.name} to restart with the stage (container "
                           f"unchanged since the apply)", overdue)
    problem = await readyz(node_host(m.address), inputs.cluster_inputs.local_api_server_port, cas)
    if problem is None:
        return None
    message = f"waiting for kube-apiserver on {m.name} to be ready: {problem}"
    if overdue:
        message += f" (more than {bound:g} s after the apply)"
    return Awaited(message, overdue)


async def report(ctx: StepContext, inputs: Inputs, message: str, machines: list[Obj]) -> Requeue:
    """InProgress (VerifyingPass) naming the control plane awaited; written only when the message changes."""
    cond = find(inputs.status.get("conditions"), names.CA_ROTATION)
    if cond is None or (cond.get("reason"), cond.get("message")) != (CARotationReason.VERIFYING_PASS,
                                                                     SCRUBBER.text(message)):
        await write(ctx, inputs, lambda s: s.__setitem__("machines", machines),
                    *in_progress(ctx, CARotationReason.VERIFYING_PASS, message))
    return Requeue(ctx.timing.ca_pass_verify_delay, "kube-apiserver restarting")
