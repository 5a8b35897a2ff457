"""The operation kinds ichord runs: ``spec.kind`` -> the operation that advances it.

The cluster actor has one operations phase and names no kind: it hands the step's scope to
``Registry.advance_all``, which steps every operation of the cluster that is not finished (or still holds its
finalizer), oldest first, and returns the soonest outcome. An operation whose kind is not registered gets a
condition and a Warning Event saying so (once), never silence.

Adding a kind is a module that builds an ``Operation`` (its behaviour, carrying its ``KindDescription``) and one
``register`` line: that line puts the description in the table of kinds (api/operation_kinds.py) too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from ichord.api import operation_kinds
from ichord.api.conditions import Condition
from ichord.api.disruptions import PlannedDisruption, by_machine
from ichord.api.names import Phase
from ichord.api.views import OperationView
from ichord.contract import ContractMismatchError
from ichord.errors import IchordError
from ichord.kube.errors import Forbidden
from ichord.operations import intent
from ichord.operations.backbone import OperationKind, bundle_mismatch, contract_mismatch, forbidden
from ichord.operations.op_status import Transition
from ichord.operations.outcome import Done, Outcome, soonest
from ichord.operations.scope import ClusterScope
from ichord.operations.step_errors import StepRetries
from ichord.render.trusted_cas import BundleMismatchError
from ichord.settings import Timing

log = structlog.get_logger("ichord.operations")

UNSUPPORTED_KIND = "UnsupportedKind"

Advance = Callable[[ClusterScope, OperationView], Awaitable[Outcome]]
#: The machines an operation disrupts on purpose right now, read from its markers (operations/disruptions.py).
Disruptions = Callable[[OperationView, Timing], list[PlannedDisruption]]


async def _nothing_held() -> None:
    """A kind that keeps nothing between steps has nothing to close."""


def _disrupts_nothing(_op: OperationView, _timing: Timing) -> list[PlannedDisruption]:
    """A kind that never reboots a node nor restarts an API server plans no disruption."""
    return []


@dataclass(frozen=True)
class Operation:
    """A registered kind: what the backbone needs (``spec``) and the step that advances one operation."""

    spec: OperationKind
    advance: Advance
    #: Closes what the kind keeps between steps (connections); called when the process stops leading.
    close: Callable[[], Awaitable[None]] = _nothing_held
    #: What the kind is disrupting now (a reboot, a kube-apiserver restart), so the machine's loss reads as planned.
    disruptions: Disruptions = _disrupts_nothing


@dataclass
class Registry:
    kinds: dict[str, Operation] = field(default_factory=dict)
    #: The one error policy: a step that raises an IchordError is retried with backoff (operations/step_errors.py).
    retries: StepRetries = field(default_factory=StepRetries)

    def register(self, operation: Operation) -> None:
        """The kind's behaviour here and its description in the table of kinds (api/operation_kinds.py), which the
        views, the backbone and the actor read: registering a kind is this one call. A description the table
        already holds under that name must be the same object (ValueError otherwise, nothing registered)."""
        if operation.spec.kind in self.kinds:
            raise ValueError(f"operation kind {operation.spec.kind!r} is registered twice")
        if operation_kinds.describe(operation.spec.kind) is not operation.spec.description:
            operation_kinds.register(operation.spec.description)  # ichord's own kinds are there from import
        self.kinds[operation.spec.kind] = operation

    def get(self, kind: str) -> Operation | None:
        return self.kinds.get(kind)

    async def close(self) -> None:
        """Close what every kind keeps between steps (the next leader, or this one again, starts afresh)."""
        for operation in self.kinds.values():
            await operation.close()

    def planned(self, scope: ClusterScope) -> dict[str, PlannedDisruption]:
        """Machine name -> the disruption an operation of the cluster has under way on it (as the scope's copies of
        the operations say, after this step's operations phase wrote them)."""
        found: list[PlannedDisruption] = []
        for op in scope.operations:
            impl = self.kinds.get(op.kind)
            if impl is not None and op.under_way:
                found.extend(impl.disruptions(op, scope.timing))
        return by_machine(found)

    async def advance_all(self, scope: ClusterScope) -> Outcome:
        """One step of each of the cluster's operations that still has something to do; the soonest outcome."""
        outcomes: list[Outcome] = []
        for op in list(scope.operations):
            impl = self.kinds.get(op.kind)
            if impl is None:
                if op.unfinished:
                    await _unknown_kind(scope, op, sorted(self.kinds))
                continue
            if op.finished and impl.spec.finalizer not in op.finalizers:
                continue
            outcomes.append(await self._step(scope, impl, op))
        self.retries.keep_only(scope)
        return soonest(*outcomes) if outcomes else Done()


    async def _step(self, scope: ClusterScope, impl: Operation, op: OperationView) -> Outcome:
        """One step of one operation under the error policy: an IchordError is a retry, anything else a bug."""
        try:
            if op.unfinished and not op.stage and not op.paused:
                # About to start (the hold, the finalizer, the lock, the first irreversible call): decided on the
                # operation as it is now, not on the informer's copy (docs/architecture.md#read-your-writes).
                fresh = await scope.reread(op)
                if fresh is None:
                    return Done()  # deleted meanwhile
                op = fresh
            # Past Pending a kind runs on the spec it accepted (a changed one is reported, never followed).
            outcome = await impl.advance(scope, await intent.keep(scope, op))
        except ContractMismatchError as exc:
            # Not transient either: the node runs another Talos than the contract, and nothing was sent to it; it
            # waits for a person (an upgrade, or spec.talosVersion), asked again every Timing.retry.
            return await contract_mismatch(scope, impl.spec, _current(scope, op).obj, exc, scope.machines)
        except BundleMismatchError as exc:
            # Not transient either: the bundle Secret holds another cluster's CAs, and nothing was applied; it waits
            # for the cluster's own bundle (docs/decisions.md#bundle-belongs), asked again every Timing.retry.
            cluster = scope.cluster
            secret = f"Secret {cluster.secret_namespace}/{cluster.secret_name}" if cluster else "the bundle Secret"
            return await bundle_mismatch(scope, impl.spec, _current(scope, op).obj, exc, scope.machines, secret)
        except Forbidden as exc:
            # Not transient: the grant stays missing until someone adds it. Said at once on the operation (its
            # kind's condition False/Forbidden naming the chart value, one Warning), not as StepsFailing after the
            # retry bound; retried every Timing.retry, so the grant once added resumes it where it stood.
            return await forbidden(scope, impl.spec, _current(scope, op).obj, exc)
        except IchordError as exc:
            return await self.retries.failed(scope, _current(scope, op), exc)
        await self.retries.succeeded(scope, _current(scope, op))
        return outcome


def _current(scope: ClusterScope, op: OperationView) -> OperationView:
    """The scope's latest copy of ``op`` (the step may have written it)."""
    return next((o for o in scope.operations if o.uid == op.uid), op)


async def _unknown_kind(scope: ClusterScope, op: OperationView, known: list[str]) -> None:
    """Pending (an ichord that runs the kind picks it up as it is), the kind's condition saying why, one Warning."""
    current = op.condition()
    if current is not None and current.get("reason") == UNSUPPORTED_KIND:
        return
    message = (f"this version of ichord does not run operations of kind {op.kind!r} (it runs: {', '.join(known)}); "
               f"nothing was done. Delete the TalosOperation, or keep it for a version of ichord that runs the kind")

    change = Transition(Condition(op.condition_type, "False", UNSUPPORTED_KIND, message), phase=Phase.PENDING,
                        event=("Warning", UNSUPPORTED_KIND), generation=True, unfinished_only=True)
    if await scope.transition(op, change):
        log.warning("operation of an unknown kind", cluster=scope.key, operation=op.name, kind=op.kind)
