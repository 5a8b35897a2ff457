"""One step of a cluster actor: everything done to one TalosCluster, re-derived from the API and nodes.

A step reads a ``ClusterScope`` once (the cluster, its machines and its operations from the informers, the
operations never older than this process's own writes of them; the bundle Secret at most once) and runs its
phases over it, each returning a typed Outcome (cluster-api's phase functions, the soonest requeue wins):

    expiry       CA expiry: status.certificates, CertificatesExpiring, the expiry metric
    renewal      spec.caRotation: one ca-rotation TalosOperation per renewal period of a CA, RotationDue
                 (docs/decisions.md#rotation-state)
    operations   one step of each operation of the cluster, through the registry (the actor names no kind)
    guard        the cluster and the machines a running operation covers held against deletion
    machines     keep every approved machine on its render, apply safe differences, report the rest

The outcome of each phase is logged and counted here, in one place. Steps are short: waits are requeues.
Elsewhere: what every actor shares (runtime.py), the status writes on the cluster and its machines
(status_writes.py), a cluster that does not exist (missing_cluster.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Hashable
from typing import Any

import anyio
import structlog

from ichord.actors import missing_cluster, one_owner
from ichord.actors.cluster_ready import (
    READY,
    MachineReady,
    bundle_cas,
    cluster_ready,
    of_machine,
    restore_command,
)
from ichord.actors.runtime import Runtime
from ichord.actors.status_writes import StatusWrites, ready_mutation
from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import ReadyReason
from ichord.api.views import ClusterView, MachineSpecError, MachineView, OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import Forbidden, KubeError
from ichord.kube.events import ObjectRef
from ichord.kube.forbidden import forbidden_message
from ichord.kube.reads import label_secret
from ichord.kube.status import StatusMutation, update_status
from ichord.machines.memo import ConfigMemo
from ichord.machines.reconciler import MachineResult, reconcile_machine
from ichord.metrics import RECONCILE_OUTCOMES
from ichord.operations import guard, windows
from ichord.operations.backbone import OperationKind
from ichord.operations.bundle_source import BundleSourceError
from ichord.operations.cert_expiry import backup_mutation, expiry_pass
from ichord.operations.lock import LockMemo
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue, describe, earliest, soonest
from ichord.operations.renewal import RenewalPass
from ichord.operations.scope import ClusterScope
from ichord.pki.bundle import SecretsBundle
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs
from ichord.render.trusted_cas import BundleCAs
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.watchers.managed_nodes import NodeWatch

log = structlog.get_logger("ichord.actors.cluster")
Obj = dict[str, Any]

MAX_PARALLEL_MACHINES = 4
#: Ready reasons of the TalosCluster for a bundle that cannot be used (BundleSourceError reasons are the same).
_UNUSABLE_BUNDLE = {BundleSourceError.SECRET_NOT_FOUND, BundleSourceError.INVALID,
                    BundleSourceError.CROSS_NAMESPACE_REFUSED, BundleSourceError.FORBIDDEN}



def _only_status_changed(m: MachineView, written: Obj) -> bool:
    """Whether ``written`` (the machine as a status write left it) differs from ``m`` (as reconciled) in its status
    and resourceVersion only: no other writer's change rode in on the write (a 409's fresh read)."""
    meta = written.get("metadata") or {}
    return ((written.get("spec") or {}) == m.spec and meta.get("generation") == m.generation
            and all(meta.get(k) == m.metadata.get(k) for k in ("labels", "annotations", "finalizers",
                                                                "deletionTimestamp", "uid")))


def _idle_for(outcome: Outcome) -> float | None:
    """Seconds until the actor steps again on its own (None: only a change wakes it)."""
    if isinstance(outcome, Requeue):
        return outcome.after
    if isinstance(outcome, Blocked):
        return outcome.retry_after
    return None


class ClusterReconciler:
    def __init__(self, rt: Runtime, namespace: str, name: str) -> None:
        self.rt = rt
        self.namespace = namespace
        self.name = name
        self.key = f"{namespace}/{name}"
        self._talos: TalosClient | None = None
        self._expiry_due: float | None = None
        self._last: dict[str, tuple[str, str]] = {}  # phase -> (outcome type, reason) last logged
        #: Configuration hashes by content, shared by this cluster's machines (ichord.machines.memo).
        self._memo = ConfigMemo()
        #: The status writes on the TalosCluster and its machines (status_writes.py).
        self._writes = StatusWrites(rt, namespace, name)
        #: Machine name -> (what its last reconcile saw, when it is due again): a machine whose inputs did not change
        #: is not read again before its own requeue (its resync), however often the cluster steps (a config rollout
        #: steps many times a minute, and read every waiting node's configuration each time).
        self._due: dict[str, tuple[tuple[object, ...], float]] = {}
        #: The cluster lock as this process last wrote it: an operation renews it with one PUT (operations/lock.py).
        self._lock_memo = LockMemo()

    def close(self) -> None:
        if self._talos is not None:
            self._talos.close()

    def _watch_nodes(self, client: KubeClient) -> NodeWatch:
        """A watch of this cluster's managed Nodes through ``client`` that wakes this actor when one is back."""
        return NodeWatch(client, functools.partial(self.rt.wake, self.namespace, self.name), self.rt.timing)

    # ---- the step -------------------------------------------------------------------------

    async def step(self, messages: dict[Hashable, str]) -> Outcome:
        try:
            outcome = await self._step(messages)
        finally:
            # The TalosCluster as this step wrote it serves this step's later writes only (the next step starts
            # from the informer's copy): kept past the step it was a second copy of every cluster, ~7 KiB each.
            self._writes.written = None
        idle = _idle_for(outcome)
        if self._talos is not None and (idle is None or idle >= self.rt.timing.talos_channel_keep):
            # Idle until the drift resync (minutes): holding a channel per machine costs memory and fds for
            # nothing; a 4,000-machine fleet held 1.6 GiB that way. The client goes too (its TLS context and
            # minted certificate, ~25 KiB a cluster); the next step mints and dials afresh.
            self._talos.close()
            self._talos = None
        return outcome

    async def _step(self, messages: dict[Hashable, str]) -> Outcome:
        self._writes.written = None
        scope = self._scope()
        if scope.cluster is None:
            self._expiry_due = None
            await missing_cluster.report(self.rt, self._writes, scope)
            return self._record("cluster", Done())
        holder = one_owner.bundle_holder(self.rt, scope.cluster)
        if holder is not None:  # another cluster's bundle: nothing of this one is managed (docs/decisions.md#one-owner)
            self._expiry_due = None
            self._due.clear()  # its machines are read afresh once it holds the bundle again
            return self._record("cluster", await one_owner.refuse_cluster(self.rt, self._writes, scope, holder))
        expiry = self._record("expiry", await self._expiry(scope, messages))
        renewal = self._record("renewal", await self._renewal(scope))
        await self._maintenance_windows(scope)
        operations = self._record("operations", await self.rt.registry.advance_all(scope))
        held = self._record("guard", await self._guard(scope))
        machines = self._record("machines", await self._machines_phase(scope))
        return soonest(expiry, renewal, operations, held, machines)

    def _scope(self) -> ClusterScope:
        cluster = self.rt.clusters.get(self.namespace, self.name)
        machines = []
        for _key, obj in self.rt.machine_index.objects(self.namespace, self.name):
            try:
                machines.append(MachineView.of(obj))
            except MachineSpecError:
                continue
        # No request: a copy older than this process's own last write is never handed out (Runtime.operations_of).
        operations = self.rt.operations_of(self.namespace, self.name) if cluster is not None else []
        return ClusterScope(self.rt.kube, self.rt.namespace, self.namespace, self.name,
                            ClusterView.of(cluster) if cluster is not None else None, machines, operations,
                            self.rt.recorder, self.rt.timing, trust=self.rt.trust,
                            allowed_secret_namespaces=self.rt.allowed_secret_namespaces, now=self.rt.clock,
                            watch_nodes=self._watch_nodes, lock_memo=self._lock_memo,
                            etcd_snapshots=self.rt.etcd_snapshots,
                            address_holder=functools.partial(one_owner.machine_holder, self.rt))

    def _record(self, phase: str, outcome: Outcome) -> Outcome:
        """The one place an outcome becomes a metric and (when it changes) a log line."""
        kind, reason = describe(outcome)
        RECONCILE_OUTCOMES.labels(phase=phase, outcome=kind, reason=reason).inc()
        if self._last.get(phase) != (kind, reason):
            self._last[phase] = (kind, reason)
            log.debug("phase outcome", cluster=self.key, phase=phase, outcome=kind, reason=reason,
                      message=SCRUBBER.text(getattr(outcome, "message", "")))
        return outcome

    # ---- expiry -----------------------------------------------------------------------------

    async def _expiry(self, scope: ClusterScope, messages: dict[Hashable, str]) -> Outcome:
        """CA expiry, first in the step so slow machine work never delays it."""
        now = time.monotonic()
        # A change of the cluster or of its bundle Secret (its informer) reads expiry again at once.
        changed = any(isinstance(k, tuple) and k and k[0] in (names.TALOS_CLUSTER, "Secret") for k in messages)
        if self._expiry_due is None or now >= self._expiry_due or changed:
            assert scope.cluster is not None
            delay = await expiry_pass(
                self.rt.kube,
                scope.cluster.obj,
                namespace_of_secret=scope.cluster.secret_namespace,
                recorder=self.rt.recorder,
                timing=self.rt.timing,
                warning_days=self.rt.warning_days,
                bundle=scope.bundle,
                on_written=self._writes.wrote,
                also=await self._ready_known(scope),
            )
            self._expiry_due = now + delay
        return Requeue(max(0.0, self._expiry_due - now), "expiry re-read")

    async def _ready_known(self, scope: ClusterScope) -> StatusMutation | None:
        """The cluster's Ready=True as the machines phase would write it, when it is already certain at the expiry
        phase: the spec renders, the full bundle reads, the Secret carries its label and no machine, as last
        reconciled, is not Ready (nothing left that could make it False but what this step's machines phase finds).
        Then the expiry write carries it, and a cold cluster's first step writes it once, not twice. Any doubt:
        None, and the machines phase decides as before."""
        assert scope.cluster is not None
        try:
            ClusterInputs.from_spec(scope.cluster.cluster_name, scope.cluster.spec)
            read = await scope.bundle()
            bundle = read.full()
        except (RenderError, BundleSourceError):
            return None
        if names.BUNDLE_LABEL not in read.secret.labels:
            return None
        cond = self._cluster_ready(scope, [of_machine(m, None) for m in scope.machines if m.approved],
                                   BundleCAs.of_bundle(bundle))
        if cond != READY:
            return None
        return ready_mutation(scope.cluster.obj, READY, backup_mutation(bundle, False, scope.now()))

    def _cluster_ready(self, scope: ClusterScope, machines: list[MachineReady], cas: BundleCAs) -> Condition:
        assert scope.cluster is not None
        cluster = scope.cluster
        return cluster_ready(machines, cas, namespace=self.namespace,
                             secret=f"Secret {cluster.secret_namespace}/{cluster.secret_name}",
                             restore=restore_command(cluster))

    # ---- rotations planned from expiry ---------------------------------------------------------

    async def _renewal(self, scope: ClusterScope) -> Outcome:
        """spec.caRotation (operations/renewal.py): after the expiry phase, before the operations phase, so an
        operation it creates is planned (or started, approval Automatic) in this same step."""
        assert scope.cluster is not None

        async def public_bundle() -> SecretsBundle | None:
            try:
                return (await scope.bundle()).public()
            except BundleSourceError:
                return None

        def created(obj: Obj) -> None:
            scope.operations.append(OperationView.of(obj))

        renewal = RenewalPass(self.rt.kube, self.rt.recorder, ClusterView.of(self._writes.written or scope.cluster.obj),
                              scope.operations, self.rt.timing.retry, scope.now(), self._writes.wrote, created)
        return await renewal.run(public_bundle)

    async def _maintenance_windows(self, scope: ClusterScope) -> None:
        """spec.maintenance.windows (operations/windows.py): the cluster's MaintenanceWindows condition, written
        only when what it says changes (a cluster that never had windows: nothing). Best effort: the operations
        read the windows themselves and refuse to start what an unreadable window would not allow."""
        assert scope.cluster is not None
        cond = windows.cluster_condition(self._writes.written or scope.cluster.obj)
        if cond is None:
            return

        def mutate(status: Obj, obj: Obj) -> Obj | None:
            fresh = windows.cluster_condition({**obj, "status": status})  # decided on the object as read
            if fresh is None:
                return None
            status["conditions"] = set_condition(status.get("conditions"), fresh, now=scope.now())
            return status

        try:
            self._writes.wrote(await update_status(crds.clusters(self.rt.kube), self.namespace, self.name, mutate,
                                                   current=self._writes.written or scope.cluster.obj))
        except KubeError as exc:
            log.warning("MaintenanceWindows not written; retried", cluster=f"{self.namespace}/{self.name}",
                        error=SCRUBBER.exception(exc))

    # ---- guarded deletes ----------------------------------------------------------------------

    def _kind_of(self, kind: str) -> OperationKind | None:
        impl = self.rt.registry.get(kind)
        return impl.spec if impl is not None else None

    def _covers(self, op: OperationView, machines: list[MachineView]) -> set[str]:
        kind = self._kind_of(op.kind)
        return kind.covers(op, machines) if kind is not None else set()

    async def _guard(self, scope: ClusterScope) -> Outcome:
        """The cluster and the machines a running operation covers held against deletion (operations/guard.py),
        after the operations phase, so an operation that just ended lets them go in the same step."""
        assert scope.cluster is not None
        try:
            await guard.reconcile(guard.GuardScope(self.rt.kube, self.rt.recorder, scope.cluster, scope.machines,
                                                   scope.operations, self._kind_of, self._covers, scope.now))
        except IchordError as exc:
            log.warning("guarded deletes: a finalizer or condition write failed; retried", cluster=self.key,
                        error=SCRUBBER.exception(exc))
            return Requeue(self.rt.timing.retry, "guard write failed")
        return Done()

    # ---- machines ---------------------------------------------------------------------------

    async def _machines_phase(self, scope: ClusterScope) -> Outcome:
        assert scope.cluster is not None
        cluster, machines = scope.cluster, scope.machines
        try:
            inputs = ClusterInputs.from_spec(cluster.cluster_name, cluster.spec)
        except RenderError as exc:
            await self._writes.blocked(cluster, machines, ReadyReason.INVALID_SPEC,
                                f"the TalosCluster spec is invalid: {exc}")
            return Done()  # only a spec change can fix it
        bundle = await self._bundle(scope)
        if bundle is None:
            return Requeue(self.rt.timing.retry, "bundle unreadable")
        cas = bundle_cas(await scope.bundle(), bundle)
        talos = self._client(bundle)
        held_by = scope.machines_held_by  # as the operations phase left it in this step
        planned = self.rt.registry.planned(scope)  # reboots/restarts ichord asked for: a loss that is no fault
        now = scope.now()

        results: dict[tuple[str, str], MachineResult] = {}
        limiter = anyio.CapacityLimiter(MAX_PARALLEL_MACHINES)
        bundle_version = (await scope.bundle()).resource_version
        clock = time.monotonic()
        not_due: dict[str, float] = {}

        def seen(m: MachineView, resource_version: object = None) -> tuple[object, ...]:
            # Everything reconcile_machine decides from, but the node itself (read again at the machine's resync):
            # its object, the cluster's spec, the bundle, the operation holding the machines, its planned disruption.
            return (resource_version or m.metadata.get("resourceVersion"), m.generation, cluster.generation,
                    bundle_version, held_by.name if held_by is not None else None, planned.get(m.name))

        async def one(m: MachineView) -> None:
            last = self._due.get(m.name)
            if last is not None and last[0] == seen(m) and clock < last[1]:
                not_due[m.name] = last[1] - clock
                return
            async with limiter:
                results[m.key] = await reconcile_machine(
                    talos,
                    bundle,
                    inputs,
                    m,
                    held_by=held_by,
                    retry_after=self.rt.timing.retry,
                    resync_after=self.rt.resync,
                    memo=self._memo,
                    planned=planned.get(m.name),
                    now=now,
                    bundle_cas=cas,
                )
            after = results[m.key].requeue_after
            if after is None:
                self._due.pop(m.name, None)
            else:
                self._due[m.name] = (seen(m), clock + after)

        self._memo.bound(len(machines))  # an entry per machine at most: what deleted machines left goes
        for gone in set(self._due) - {m.name for m in machines}:
            del self._due[gone]
        # A machine whose node or hostname another machine holds is neither dialled nor applied
        # (docs/decisions.md#one-owner).
        refused = {m.name: r for m in machines if m.approved and (r := one_owner.machine_refusal(self.rt, m))}
        async with anyio.create_task_group() as tg:
            for m in machines:
                if m.approved and m.name not in refused:
                    tg.start_soon(one, m)
        delays: list[float | None] = []
        for m in machines:
            if not m.approved:
                await self._writes.write_machine(
                    m,
                    MachineResult(
                        Condition(
                            names.READY,
                            "Unknown",
                            ReadyReason.NOT_APPROVED,
                            "the machine is not approved; set spec.approved: true to let ichord manage it",
                        )
                    ),
                )
                continue
            if m.name in refused:
                self._due.pop(m.name, None)  # read at once when it holds the node
                await self._writes.write_machine(m, refused[m.name])
                delays.append(refused[m.name].requeue_after)
                continue
            if m.name in not_due:  # nothing it depends on changed since its last reconcile: nothing to write
                delays.append(not_due[m.name])
                continue
            result = results[m.key]
            written = await self._writes.write_machine(m, result)
            due = self._due.get(m.name)
            if written is not None and due is not None and _only_status_changed(m, written):
                # This step's own status write is no change of what the machine is reconciled from: the node is not
                # read again for it (it was, once per machine, on every cold start).
                self._due[m.name] = (seen(m, (written.get("metadata") or {}).get("resourceVersion")), due[1])
            delays.append(result.requeue_after)
        await self._write_cluster_ready(scope, [of_machine(m, results.get(m.key)) for m in machines if m.approved],
                                        bundle, cas)
        delay = earliest(*delays)
        return Done() if delay is None else Requeue(delay, "machines")

    async def _write_cluster_ready(self, scope: ClusterScope, machines: list[MachineReady], bundle: SecretsBundle,
                                   cas: BundleCAs) -> None:
        """The cluster's Ready from its machines (cluster_ready.py), BundleBackupStale following the bundle's
        standing in the same write; one Warning when the nodes start refusing the bundle."""
        assert scope.cluster is not None
        cluster = scope.cluster
        cond = self._cluster_ready(scope, machines, cas)
        before = find(cluster.status.get("conditions"), names.READY)
        mismatch = cond.reason == ReadyReason.BUNDLE_MISMATCH
        if not await self._writes.set_cluster_ready(cluster.obj, cond, backup_mutation(bundle, mismatch, scope.now())):
            return
        reason = before.get("reason") if before is not None else None
        if mismatch and reason != ReadyReason.BUNDLE_MISMATCH:
            self.rt.recorder.record(ObjectRef.of(self._writes.written or cluster.obj), "Warning",
                                    names.EventReason.BUNDLE_MISMATCH, cond.message)
        if reason in _UNUSABLE_BUNDLE:
            # The bundle just became usable (it was missing or invalid): publish expiry now, not at its retry.
            # A cluster's first Ready needs no second pass: this step's expiry phase read the same bundle.
            self._expiry_due = None
            await self._expiry(scope, {})

    async def _bundle(self, scope: ClusterScope) -> SecretsBundle | None:
        """The full bundle for rendering; a missing or invalid one is reported on the cluster and its machines."""
        assert scope.cluster is not None
        try:
            read = await scope.bundle()
            bundle = read.full()
        except BundleSourceError as exc:
            if exc.reason in _UNUSABLE_BUNDLE:
                await self._writes.blocked(scope.cluster, scope.machines, exc.reason, exc.message)
            else:
                log.warning("bundle read failed", cluster=self.key, error=exc.message)
            return None
        if names.BUNDLE_LABEL not in read.secret.labels and not await self._label_bundle(
                scope, read.secret.namespace, read.secret.name):
            return None
        return bundle

    async def _label_bundle(self, scope: ClusterScope, namespace: str, secret_name: str) -> bool:
        """Label the referenced Secret so the bundle informer sees its next change (once: then it carries it).

        False when the management API refuses the update (403): the grant a rotation needs to write the Secret is
        missing, so the cluster says so now (Ready=False/Forbidden) rather than at a rotation's first write."""
        assert scope.cluster is not None
        try:
            await label_secret(self.rt.kube, namespace, secret_name, {names.BUNDLE_LABEL: "true"})
        except Forbidden as exc:
            await self._writes.blocked(scope.cluster, scope.machines, ReadyReason.FORBIDDEN,
                                f"cannot label Secret {namespace}/{secret_name} (spec.secretsRef): "
                                f"{forbidden_message(exc, cluster_namespace=self.namespace)}")
            return False
        except KubeError as exc:
            log.warning("cannot label the bundle Secret; its changes are seen at the next resync instead",
                        cluster=self.key, secret=f"{namespace}/{secret_name}", error=str(exc))
        return True

    def _client(self, bundle: SecretsBundle) -> TalosClient:
        dial = DialBundle.from_bundle(bundle)
        if self._talos is None:
            self._talos = TalosClient(dial)
        else:
            self._talos.set_dial(dial)
        return self._talos
