"""The passes Accepting, Issuing, Dropping: apply the stage's render where a node differs, verify later.

Which machines a pass still has to visit is never stored: it is re-derived from each node (its
running configuration against the stage's render), so a pass killed after any apply resumes with
no apply repeated (ADR 0063 step 3). Control planes first, then workers; dry run, then NO_REBOOT.
Verification is a separate step from applying, so a CA change's kubelet restart has begun first.
Workers may be applied a few at a time (``Inputs.worker_bound``: maxUnavailable); control planes never are,
and when the pass restarts kube-apiserver one control plane is applied only once the one before it runs a new
kube-apiserver that answers /readyz (apiserver_instances).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from ichord.api.carotation import Stage
from ichord.api.names import CARotationReason
from ichord.api.views import MachineView
from ichord.failpoints import failpoint
from ichord.operations.ca_rotation import apiserver_instances, ca_view
from ichord.operations.ca_rotation.context import Inputs, RotationContext
from ichord.operations.ca_rotation.managed import ManagedAPIError, admin_client, not_ready_nodes
from ichord.operations.ca_rotation.plan import apply_dial, verify_dial
from ichord.pki.rotation import Rotation, Target
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.render.errors import RenderError
from ichord.render.inputs import MachineInputs
from ichord.render.stages import StageRenderError, render_stage
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.errors import TalosError

log = structlog.get_logger("ichord.operations.ca_rotation")

UNREACHABLE = "Unreachable"  # a machine's status.machines state when it did not answer the pass


@dataclass
class PassResult:
    applied: list[str] = field(default_factory=list)  # machines applied in this step
    problem: str | None = None  # the cause that holds the stage
    #: The problem is a machine that does not answer (yet): a wait within the bound, not a fault (issue 12).
    waiting: bool = False
    machines: list[dict[str, Any]] = field(default_factory=list)  # status.machines
    #: The problem is a control plane's kube-apiserver restarting (apiserver_instances): one at a time.
    restarting: bool = False


@dataclass(frozen=True)
class PassWait:
    """What a pass's verification still waits for: a condition reason (VerifyingPass, AwaitingNodes) and why."""

    reason: str
    message: str


def stage_render(inputs: Inputs, rotation: Rotation, stage: Stage, m: MachineView) -> MachineConfig:
    return render_stage(inputs.bundle, rotation, stage, inputs.cluster_inputs, MachineInputs.from_spec(m.spec))


def kubernetes_cas(inputs: Inputs, rotation: Rotation) -> list[bytes]:
    """Every Kubernetes CA the managed API server may serve from during the rotation."""
    new = rotation.new.get(Target.KUBERNETES)
    return [inputs.bundle.k8s.cert_pem] + ([new.cert_pem] if new else [])


@dataclass
class _Visit:
    entry: dict[str, Any]  # the machine's status.machines entry
    problem: str | None = None
    applied: bool = False


async def _visit(talos: TalosClient, inputs: Inputs, rotation: Rotation, stage: Stage, m: MachineView,
                 before_apply: Callable[[], Awaitable[None]] | None = None) -> _Visit:
    """One machine: render the stage, read what it runs, and where they differ dry run then apply."""
    try:
        desired = stage_render(inputs, rotation, stage, m)
    except (RenderError, StageRenderError) as exc:
        problem = f"machine {m.name} cannot be rendered for {stage.value}: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": "RenderFailed", "message": problem}, problem)
    try:
        running = MachineConfig.plain_of(await talos.machine_config(m.address))
    except (TalosError, ConfigParseError) as exc:
        problem = f"machine {m.name} ({m.address}) does not answer: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": UNREACHABLE, "message": problem}, problem)
    if running == desired.plain():
        return _Visit({"name": m.name, "state": stage.value, "message": f"runs {stage.value}"})
    data = desired.to_bytes()
    try:
        await talos.apply_configuration(m.address, data, ApplyMode.NO_REBOOT, dry_run=True)
        if before_apply is not None:
            await before_apply()
        failpoint(f"ca-rotation.apply.before.{stage.value.lower()}")
        await talos.apply_configuration(m.address, data, ApplyMode.NO_REBOOT)
    except TalosError as exc:
        problem = f"machine {m.name} refused the {stage.value} configuration: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": "ApplyFailed", "message": problem}, problem)
    failpoint(f"ca-rotation.apply.after.{stage.value.lower()}")
    log.info("ca-rotation stage applied", cluster=f"{inputs.op_namespace}/{inputs.cluster_name}", operation=inputs.name,
             stage=stage.value, machine=m.name)
    return _Visit({"name": m.name, "state": stage.value, "message": f"applied {stage.value}"}, applied=True)


async def _visit_concurrently(talos: TalosClient, inputs: Inputs, rotation: Rotation, stage: Stage,
                              machines: list[MachineView], limit: int) -> list[_Visit]:
    """Visit ``machines`` at most ``limit`` at a time; after the first problem no further visit starts (those in
    flight finish). Returns the visits made, in the order of ``machines``."""
    visits: list[_Visit | None] = [None] * len(machines)
    limiter = anyio.CapacityLimiter(limit)
    stopped = False

    async def one(i: int, m: MachineView) -> None:
        nonlocal stopped
        async with limiter:
            if stopped:
                return
            visits[i] = visit = await _visit(talos, inputs, rotation, stage, m)
            stopped = stopped or visit.problem is not None

    try:
        async with anyio.create_task_group() as tg:
            for i, m in enumerate(machines):
                tg.start_soon(one, i, m)
    except BaseExceptionGroup as group:
        # An unexpected error (not a machine's problem) leaves as itself, as it would from the serial loop.
        raise _first_leaf(group) from None
    return [v for v in visits if v is not None]


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def apply_pass(ctx: RotationContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> PassResult:
    """Apply ``stage`` to every machine that does not run it yet (one step; failpoints around each apply).

    Control planes one at a time, in order (each apply restarts that node's kube-apiserver); then the workers,
    up to ``inputs.worker_bound.at_once`` at once. The first problem (in machine order) holds the stage."""
    result = PassResult()
    talos = ctx.talos_factory(apply_dial(inputs.bundle, rotation, stage))
    workers = [m for m in inputs.machines if not m.is_control_plane]
    limit = inputs.worker_bound.at_once
    serial = [m for m in inputs.machines if m.is_control_plane or limit == 1]
    one_apiserver = apiserver_instances.restarts_apiserver(rotation.targets)
    try:
        visits: list[_Visit] = []
        for m in serial:
            gated = one_apiserver and m.is_control_plane
            record = functools.partial(apiserver_instances.record_before_apply, ctx, inputs, talos, m)
            visits.append(await _visit(talos, inputs, rotation, stage, m, record if gated else None))
            if visits[-1].problem is not None:
                break
            if gated and visits[-1].applied:
                break  # the next control plane waits for this one's kube-apiserver (apiserver_instances)
            if gated and (wait := await apiserver_instances.awaited(ctx, inputs, talos, m,
                                                                     kubernetes_cas(inputs, rotation))):
                visits[-1] = _Visit({"name": m.name, "state": "APIServerRestarting", "message": wait.message},
                                    wait.message)
                result.restarting, result.waiting = True, not wait.overdue
                break
        else:
            if limit > 1 and workers:
                visits += await _visit_concurrently(talos, inputs, rotation, stage, workers, limit)
        by_name = {m.name: m for m in inputs.machines}
        for visit in visits:
            seen = by_name.get(str(visit.entry["name"]))
            if seen is not None and visit.entry.get("state") != UNREACHABLE:
                cas = await ca_view.node_cas(talos, seen, rotation.targets)
                if cas:
                    visit.entry["cas"] = cas
            result.machines.append(visit.entry)
            if visit.applied:
                result.applied.append(str(visit.entry["name"]))
            if visit.problem is not None and result.problem is None:
                result.problem = visit.problem
                result.waiting = result.waiting or visit.entry.get("state") == UNREACHABLE
        return result
    finally:
        talos.close()


async def verify_pass(ctx: RotationContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> PassWait | None:
    """None when every machine answers the stage's credentials and every Node is Ready; else what it waits for.

    Right after a pass each of these is normal for a while (apid and the kubelet restart on a CA change, the
    API server with them): the caller waits within a bound and only then holds the stage as Blocked."""
    talos = ctx.talos_factory(verify_dial(inputs.bundle, rotation, stage))
    try:
        for m in inputs.machines:
            try:
                await talos.version(m.address)
            except TalosError as exc:
                return PassWait(CARotationReason.VERIFYING_PASS,
                                f"machine {m.name} ({m.address}) does not answer the {stage.value} credentials "
                                f"yet: {SCRUBBER.exception(exc)}")
        try:
            async with admin_client(talos, inputs.control_planes, kubernetes_cas(inputs, rotation)) as kc:
                not_ready = await not_ready_nodes(kc)
        except ManagedAPIError as exc:
            return PassWait(CARotationReason.VERIFYING_PASS, str(exc))
        if not_ready:
            return PassWait(CARotationReason.AWAITING_NODES,
                            f"waiting for Node(s) to be Ready after {stage.value}: {', '.join(not_ready)}")
        return None
    finally:
        talos.close()
