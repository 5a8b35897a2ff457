"""A cluster actor whose TalosCluster does not exist (deleted, or a typo in a spec.clusterRef): nothing may stay
silent or held.

Its expiry series end (the metric ends with its object), its machines are let go (guarded deletes: no operation
of a missing cluster runs) and each says Ready=False/ClusterNotFound with one Warning, and every unfinished
operation naming it takes its kind's condition False/ClusterNotFound (phase Pending, or Paused once started) with
one Warning, written through the one writer (operations/op_status.py). The cluster's creation wakes the actor,
and the operation's own step then replaces the condition.
"""

from __future__ import annotations

import structlog

from ichord.actors.runtime import Runtime
from ichord.actors.status_writes import StatusWrites
from ichord.api import names
from ichord.api.conditions import Condition
from ichord.api.names import ReadyReason
from ichord.api.views import OperationView
from ichord.errors import IchordError
from ichord.kube.errors import NotFound
from ichord.machines.reconciler import MachineResult
from ichord.operations import guard, op_status
from ichord.operations.cert_expiry import forget_cluster
from ichord.operations.op_status import Transition
from ichord.operations.scope import ClusterScope
from ichord.pki.scrub import SCRUBBER

log = structlog.get_logger("ichord.actors.cluster")


async def report(rt: Runtime, writes: StatusWrites, scope: ClusterScope) -> None:
    """The cluster is gone (or never was): its expiry series end, its machines are let go and say so, and every
    unfinished operation naming it says so."""
    forget_cluster(scope.namespace, scope.name)
    message = f"TalosCluster {scope.key} does not exist; create it or fix spec.clusterRef.name"
    try:
        await guard.release_machines(rt.kube, scope.machines)  # no operation of a missing cluster runs
    except IchordError as exc:
        log.warning("cannot let go of the machines of a missing cluster", cluster=scope.key,
                    error=SCRUBBER.exception(exc))
    await hold_operations(rt, scope, names.EventReason.CLUSTER_NOT_FOUND, message)
    for m in scope.machines:
        await writes.write_machine(
            m,
            MachineResult(
                Condition(names.READY, "False", ReadyReason.CLUSTER_NOT_FOUND, message),
                event=("Warning", ReadyReason.CLUSTER_NOT_FOUND, message),
            ),
        )


async def hold_operations(rt: Runtime, scope: ClusterScope, reason: str, message: str) -> None:
    """Every unfinished TalosOperation naming this cluster, which no step may run, says why (a typo must not be
    silent): ``reason`` ClusterNotFound here, BundleInUse for a cluster another holds the bundle of (one_owner.py).

    Not started: phase Pending; started (the cluster was deleted under it): Paused. The condition is the
    kind's own, with one Warning Event when it is first set. The cluster's creation (the holder's going) wakes
    this actor, and the operation's own step then replaces the condition.
    """
    for op in rt.operations_of(scope.namespace, scope.name):
        if op.finished:
            continue
        current = op.condition()
        if current is not None and current.get("reason") == reason:
            continue
        # Decided on the object as read for the write, not the informer's copy: a status written in between
        # (the operation finished, or already says so) is never overwritten by a stale view.
        change = Transition(Condition(op.condition_type, "False", reason, message),
                            phase=_pending_or_paused, event=("Warning", reason),
                            generation=True, unfinished_only=True)
        try:
            _, moved = await op_status.transition(rt.kube, rt.recorder, scope.now, op.obj, change, current=op.obj)
        except NotFound:
            continue
        except IchordError as exc:
            log.warning("operation status write failed", cluster=scope.key, operation=op.name,
                        error=SCRUBBER.exception(exc))
            continue
        if moved:  # else written meanwhile: finished, or already saying so (and its one Warning posted)
            log.warning("operation held: its cluster cannot run it", cluster=scope.key, operation=op.name,
                        reason=reason)


def _pending_or_paused(op: OperationView) -> str:
    """An operation whose cluster cannot run it: Paused once started (its stage kept), else Pending."""
    return names.Phase.PAUSED if op.stage else names.Phase.PENDING
