"""The passes Accepting, Issuing, Dropping: apply the stage's render where a node differs, verify later.

Which machines a pass still has to visit is never stored: it is re-derived from each node (its
running configuration against the stage's render), so a pass killed after any apply resumes with
no apply repeated (docs/decisions.md#rotation-state). Control planes first, then workers; dry run, then NO_REBOOT.
Verification is a separate step from applying, so a CA change's kubelet restart has begun first.

Talos RPCs per machine and pass on the happy path (issue 19): the dry run, which is also the read that tells
whether the node differs (Talos answers "No changes." for the configuration it runs), the apply, and one verify
read with the stage's credentials that is also the per-node CA view (a COSI Get of the CA resources; Version
where the machine has no view). A machine's status.machines entry records the stage and the render's hash once
the node runs it, so later steps of the same pass do not ask the node again while the render is unchanged; a step
killed before that write asks again, and the dry run's "No changes." keeps it from applying twice.
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
from ichord.api.names import CARotationReason, ReadyReason
from ichord.api.views import MachineView
from ichord.failpoints import failpoint
from ichord.operations.ca_rotation import apiserver_instances, ca_view
from ichord.operations.ca_rotation.managed_objects import not_ready_nodes
from ichord.operations.ca_rotation.plan import apply_dial, verify_dial
from ichord.operations.managed.clients import ManagedAPIError, cluster_client
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.pki.rotation import Rotation, Target
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import MachineConfig
from ichord.render.errors import RenderError
from ichord.render.inputs import MachineInputs
from ichord.render.stages import StageRenderError, render_stage
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.errors import TalosCertificateError, TalosError, TalosUnreachableError

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


#: The status.machines entry's record of the render a node was seen to run (or was given) in this stage.
RENDER_KEY = "render"
#: Set on a control plane's entry once its kube-apiserver was seen to restart after this stage's apply.
APISERVER_KEY = "apiServer"
APISERVER_RESTARTED = "Restarted"
#: The state of a control plane that runs the stage while its kube-apiserver restart is awaited.
APISERVER_RESTARTING = "APIServerRestarting"


def _entries(inputs: Inputs) -> dict[str, dict[str, Any]]:
    return {str(e.get("name")): dict(e) for e in inputs.status.get("machines") or [] if isinstance(e, dict)}


def _runs(entry: dict[str, Any] | None, stage: Stage, render: str) -> bool:
    """The entry says the node runs exactly this render of ``stage`` (written after it was seen or applied)."""
    return (entry is not None and entry.get("state") in (stage.value, APISERVER_RESTARTING)
            and entry.get(RENDER_KEY) == render)


def no_changes(mode_details: str) -> bool:
    """Talos's dry run found nothing to change: its summary ends "Config diff:" then "No changes.".

    Anything else (a diff, or a summary this does not recognise) counts as a change: applying the
    configuration a node already runs restarts nothing, so erring that way is safe."""
    _, marker, diff = mode_details.rpartition("Config diff:")
    return bool(marker) and diff.strip() == "No changes."


async def _visit(talos: TalosClient, inputs: Inputs, rotation: Rotation, stage: Stage, m: MachineView,
                 seen: dict[str, Any] | None, before_apply: Callable[[], Awaitable[None]] | None = None) -> _Visit:
    """One machine: render the stage; unless ``seen`` (its status entry) says it runs that render, dry run, and
    apply where the dry run finds a change."""
    try:
        desired = stage_render(inputs, rotation, stage, m)
    except (RenderError, StageRenderError) as exc:
        problem = f"machine {m.name} cannot be rendered for {stage.value}: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": ReadyReason.RENDER_FAILED, "message": problem}, problem)
    render = desired.hash()
    carried = {k: seen[k] for k in ("cas", APISERVER_KEY) if seen and k in seen}
    if seen is not None and _runs(seen, stage, render):
        return _Visit({**seen, "message": f"runs {stage.value}"} if seen.get("state") == stage.value else {**seen})
    data = desired.wire_bytes()
    try:
        dry = await talos.apply_configuration(m.address, data, ApplyMode.NO_REBOOT, dry_run=True,
                                              contract=inputs.cluster_inputs.contract)
    except (TalosUnreachableError, TalosCertificateError) as exc:
        problem = f"machine {m.name} ({m.address}) does not answer: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": UNREACHABLE, "message": problem, **carried}, problem)
    except TalosError as exc:
        problem = f"machine {m.name} refused the {stage.value} configuration: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": ReadyReason.APPLY_FAILED, "message": problem, **carried}, problem)
    entry = {"name": m.name, "state": stage.value, RENDER_KEY: render, **carried}
    if no_changes(dry.mode_details):
        return _Visit({**entry, "message": f"runs {stage.value}"})
    try:
        if before_apply is not None:
            await before_apply()
        failpoint(f"ca-rotation.apply.before.{stage.value.lower()}")
        await talos.apply_configuration(m.address, data, ApplyMode.NO_REBOOT, contract=inputs.cluster_inputs.contract)
    except TalosError as exc:
        problem = f"machine {m.name} refused the {stage.value} configuration: {SCRUBBER.exception(exc)}"
        return _Visit({"name": m.name, "state": ReadyReason.APPLY_FAILED, "message": problem, **carried}, problem)
    failpoint(f"ca-rotation.apply.after.{stage.value.lower()}")
    log.info("ca-rotation stage applied", cluster=f"{inputs.op_namespace}/{inputs.cluster_name}", operation=inputs.name,
             stage=stage.value, machine=m.name)
    entry.pop(APISERVER_KEY, None)  # a new apply: its kube-apiserver restart is awaited afresh
    return _Visit({**entry, "message": f"applied {stage.value}"}, applied=True)


async def _visit_concurrently(talos: TalosClient, inputs: Inputs, rotation: Rotation, stage: Stage,
                              machines: list[MachineView], seen: dict[str, dict[str, Any]],
                              limit: int) -> list[_Visit]:
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
            visits[i] = visit = await _visit(talos, inputs, rotation, stage, m, seen.get(m.name))
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


async def apply_pass(ctx: StepContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> PassResult:
    """Apply ``stage`` to every machine that does not run it yet (one step; failpoints around each apply).

    Control planes one at a time, in order (each apply restarts that node's kube-apiserver); then the workers,
    up to ``inputs.worker_bound.at_once`` at once. The first problem (in machine order) holds the stage."""
    result = PassResult()
    talos = ctx.talos_factory(apply_dial(inputs.bundle, rotation, stage))
    workers = [m for m in inputs.machines if not m.is_control_plane]
    limit = inputs.worker_bound.at_once
    serial = [m for m in inputs.machines if m.is_control_plane or limit == 1]
    one_apiserver = apiserver_instances.restarts_apiserver(rotation.targets)
    seen = _entries(inputs)
    try:
        visits: list[_Visit] = []
        for m in serial:
            gated = one_apiserver and m.is_control_plane
            record = functools.partial(apiserver_instances.record_before_apply, ctx, inputs, talos, m)
            visits.append(await _visit(talos, inputs, rotation, stage, m, seen.get(m.name), record if gated else None))
            if visits[-1].problem is not None:
                break
            if gated and visits[-1].applied:
                break  # the next control plane waits for this one's kube-apiserver (apiserver_instances)
            if not gated:
                continue
            entry = visits[-1].entry
            restarted = entry.get(APISERVER_KEY) == APISERVER_RESTARTED
            wait = await apiserver_instances.awaited(ctx, inputs, talos, m, kubernetes_cas(inputs, rotation),
                                                     restarted=restarted)
            if wait is None:
                # Its restart was seen: later steps ask only its /readyz, never its container again.
                visits[-1] = _Visit({**entry, "state": stage.value, APISERVER_KEY: APISERVER_RESTARTED,
                                     "message": entry.get("message") if entry.get("state") == stage.value
                                     else f"runs {stage.value}"})
                continue
            visits[-1] = _Visit({**entry, "state": APISERVER_RESTARTING, "message": wait.message}, wait.message)
            result.restarting, result.waiting = True, not wait.overdue
            break
        else:
            if limit > 1 and workers:
                visits += await _visit_concurrently(talos, inputs, rotation, stage, workers, seen, limit)
        for visit in visits:
            result.machines.append(visit.entry)
            if visit.applied:
                result.applied.append(str(visit.entry["name"]))
            if visit.problem is not None and result.problem is None:
                result.problem = visit.problem
                result.waiting = result.waiting or visit.entry.get("state") == UNREACHABLE
        return result
    finally:
        talos.close()


#: Verification reads run this many at once: reads restart nothing, so they need no maxUnavailable.
VERIFY_CONCURRENCY = 16


@dataclass
class Verified:
    """Every machine answered the stage's credentials and every Node is Ready; ``cas``: the per-node CA view
    the verification read, by machine name."""

    cas: dict[str, dict[str, Any]]

    def machines(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pass's status.machines entries with the view read."""
        return [{**e, "cas": self.cas[str(e.get("name"))]} if self.cas.get(str(e.get("name"))) else e
                for e in entries]


async def _verify_read(talos: TalosClient, m: MachineView, targets: tuple[Target, ...]) -> dict[str, Any]:
    """One read with the stage's credentials per CA resource (ca_view), or Version where ``m`` has none."""
    if not ca_view.reads(m, targets):
        await talos.version(m.address)
        return {}
    try:
        return await ca_view.read_node_cas(talos, m, targets)
    except ValueError:
        return {}  # the node answered (the credentials are proven); a certificate in it did not parse


async def verify_pass(ctx: StepContext, inputs: Inputs, rotation: Rotation, stage: Stage) -> PassWait | Verified:
    """Verified when every machine answers the stage's credentials and every Node is Ready; else what it waits for.

    The reads go out at once (VERIFY_CONCURRENCY); the first machine in order that does not answer is named.
    Right after a pass each of these is normal for a while (apid and the kubelet restart on a CA change, the
    API server with them): the caller waits within a bound and only then holds the stage as Blocked."""
    talos = ctx.talos_factory(verify_dial(inputs.bundle, rotation, stage))
    targets = tuple(rotation.targets)
    limiter = anyio.CapacityLimiter(VERIFY_CONCURRENCY)
    views: list[dict[str, Any] | TalosError] = [{} for _ in inputs.machines]

    async def one(i: int, m: MachineView) -> None:
        async with limiter:
            try:
                views[i] = await _verify_read(talos, m, targets)
            except TalosError as exc:
                views[i] = exc

    try:
        async with anyio.create_task_group() as tg:
            for i, m in enumerate(inputs.machines):
                tg.start_soon(one, i, m)
        cas: dict[str, dict[str, Any]] = {}
        for m, view in zip(inputs.machines, views, strict=True):
            if isinstance(view, TalosError):
                return PassWait(CARotationReason.VERIFYING_PASS,
                                f"machine {m.name} ({m.address}) does not answer the {stage.value} credentials "
                                f"yet: {SCRUBBER.exception(view)}")
            cas[m.name] = view
        try:
            async with cluster_client(ctx.managed, inputs.cluster_key, talos, inputs.control_planes,
                                      kubernetes_cas(inputs, rotation), issued_in=stage.value) as kc:
                not_ready = await not_ready_nodes(kc)
        except ManagedAPIError as exc:
            return PassWait(CARotationReason.VERIFYING_PASS, str(exc))
        if not_ready:
            return PassWait(CARotationReason.AWAITING_NODES,
                            f"waiting for Node(s) to be Ready after {stage.value}: {', '.join(not_ready)}")
        return Verified(cas)
    finally:
        talos.close()
