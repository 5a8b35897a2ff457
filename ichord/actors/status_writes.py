"""The status writes of one cluster actor's step on its TalosCluster and TalosMachines, in one place.

The cluster's Ready condition starts from the object this step wrote last (``written``), else from the informer's
copy: one PATCH, no GET; a copy that is stale by then costs a 409 and a fresh read, never a lost update. A
machine's Ready and the fields the reconciler owns are written only when they change, and the Event that goes with
them only when the reason changed or something was applied. A 403 on an object's own status write cannot carry
its own condition: one Warning Event on the object says what was refused (once per object and message).
"""

from __future__ import annotations

from typing import Any

import structlog

from ichord.actors.runtime import Runtime
from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import ReadyReason
from ichord.api.views import ClusterView, MachineView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.errors import Forbidden, NotFound
from ichord.kube.events import ObjectRef
from ichord.kube.forbidden import forbidden_message
from ichord.kube.status import StatusMutation, update_status
from ichord.machines.reconciler import OWNED_FIELDS, MachineResult
from ichord.pki.scrub import SCRUBBER

log = structlog.get_logger("ichord.actors.cluster")
Obj = dict[str, Any]

#: Machine Ready reasons that say the same as the cluster's (the rest of the unusable bundles are BundleInvalid).
_MACHINE_REASON_AS_CLUSTER = {ReadyReason.FORBIDDEN, ReadyReason.BUNDLE_IN_USE}


def _says(current: Obj | None, cond: Condition) -> bool:
    """Whether the Ready condition ``current`` already says what ``cond`` says (its time and generation aside)."""
    return current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
        cond.status, cond.reason, SCRUBBER.text(cond.message))


def ready_mutation(cluster: Obj, cond: Condition, also: StatusMutation | None = None) -> StatusMutation:
    """The TalosCluster's Ready set to ``cond`` for the generation of ``cluster`` (the copy it was decided on);
    a status whose Ready already says the same is left as it is. ``also``: what changes with Ready, applied after
    it to the same status (BundleBackupStale, which follows the bundle's standing)."""
    generation = ClusterView.of(cluster).generation

    def mutate(status: Obj, obj: Obj) -> Obj:
        if _says(find(status.get("conditions"), names.READY), cond):
            return status
        status["conditions"] = set_condition(status.get("conditions"), cond, observed_generation=generation)
        status["observedGeneration"] = generation
        if also is not None:
            status = also(status, obj) or status
        return status

    return mutate


class StatusWrites:
    def __init__(self, rt: Runtime, namespace: str, name: str) -> None:
        self.rt = rt
        self.namespace = namespace
        self.name = name
        self.key = f"{namespace}/{name}"
        #: The TalosCluster as this step last wrote it: the next status write starts from it, not from a GET.
        self.written: Obj | None = None
        #: 403s on status writes already told by a Warning (object key, message): a refused status write cannot
        #: carry its own condition, so its one Warning is remembered here instead of in the object.
        self._denied: set[tuple[str, str]] = set()

    async def blocked(self, cluster: ClusterView, machines: list[MachineView], reason: str, message: str) -> None:
        """The cluster's Ready False for ``reason`` (one Warning when it changed), and each approved machine's Ready
        saying why it cannot be rendered (no Event: the cluster's says it)."""
        changed = await self.set_cluster_ready(cluster.obj, Condition(names.READY, "False", reason, message))
        if changed:
            self.rt.recorder.record(ObjectRef.of(cluster.obj), "Warning", reason, message)
        for m in machines:
            if m.approved:
                await self.write_machine(
                    m,
                    MachineResult(
                        Condition(
                            names.READY,
                            "False",
                            reason if reason in _MACHINE_REASON_AS_CLUSTER else
                            ReadyReason.BUNDLE_INVALID if reason != ReadyReason.INVALID_SPEC
                            else ReadyReason.RENDER_FAILED,
                            f"cluster {self.name}: {message}",
                        )
                    ),
                    post=False,
                )

    def wrote(self, cluster: Obj) -> None:
        self.written = cluster

    async def set_cluster_ready(self, cluster: Obj, cond: Condition, also: StatusMutation | None = None) -> bool:
        """Set the TalosCluster's Ready condition (and ``also``, with it); True when it changed.

        The write starts from the object this step wrote last, else from ``cluster`` (the informer's): one
        PATCH, no GET. A copy that is stale by then costs a 409 and a fresh read, never a lost update.
        """
        cluster = self.written or cluster
        if _says(find(ClusterView.of(cluster).status.get("conditions"), names.READY), cond):
            return False
        try:
            self.written = await update_status(crds.clusters(self.rt.kube), self.namespace, self.name,
                                                ready_mutation(cluster, cond, also), current=cluster)
        except NotFound:
            return False
        except Forbidden as exc:
            self.status_refused(ObjectRef.of(cluster), exc)
            return False
        return True

    def status_refused(self, ref: ObjectRef, exc: Forbidden) -> None:
        """A 403 on an object's own status write: the condition cannot be written, so one Warning Event on the
        object says what was refused and which chart value grants it (and the log, once)."""
        key = f"{ref.kind} {ref.namespace}/{ref.name}"
        message = f"this object's status cannot be written: {forbidden_message(exc)}"
        if (key, message) in self._denied:
            return
        self._denied.add((key, message))
        log.warning("status write refused", cluster=self.key, object=key, error=message)
        self.rt.recorder.record(ref, "Warning", names.EventReason.FORBIDDEN, message)

    async def write_machine(self, m: MachineView, result: MachineResult, *, post: bool = True) -> Obj | None:
        """Write the machine's Ready and owned fields when they changed; returns the object as written (None when
        nothing was sent or the write failed)."""
        old_ready = find(m.status.get("conditions"), names.READY)
        desired_fields = {k: v for k, v in result.fields.items() if k in OWNED_FIELDS}
        same_ready = old_ready is not None and (
            old_ready.get("status"),
            old_ready.get("reason"),
            old_ready.get("message"),
        ) == (result.ready.status, result.ready.reason, SCRUBBER.text(result.ready.message))
        same_fields = all(m.status.get(k, [] if k.endswith("Paths") else None) == v for k, v in desired_fields.items())
        if same_ready and same_fields and m.status.get("observedGeneration") == m.generation:
            return None

        def mutate(status: Obj, _obj: Obj) -> Obj:
            status["conditions"] = set_condition(
                status.get("conditions"), result.ready, observed_generation=m.generation
            )
            status.update(desired_fields)
            status["observedGeneration"] = m.generation
            return status

        try:
            written = await update_status(crds.machines(self.rt.kube), m.namespace, m.name, mutate,
                                          current=self.rt.machines.cache.get((m.namespace, m.name)))
        except NotFound:
            return None
        except Forbidden as exc:
            self.status_refused(ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), exc)
            return None
        except IchordError as exc:
            log.warning("machine status write failed", cluster=self.key, machine=m.name,
                        error=SCRUBBER.exception(exc))
            return None
        reason_changed = old_ready is None or old_ready.get("reason") != result.ready.reason
        if post and result.event is not None and (reason_changed or result.applied):
            type_, reason, message = result.event
            self.rt.recorder.record(
                ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), type_, reason, message
            )
        return written
