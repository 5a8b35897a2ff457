"""One step of a cluster actor: everything done to one TalosCluster, re-derived from the API and nodes.

A step reads a ``ClusterScope`` once (the cluster, its machines and its operations from the informers, the
operations never older than this process's own writes of them; the bundle Secret at most once) and runs three
phases over it, each returning a typed Outcome (cluster-api's phase functions, the soonest requeue wins):

    expiry       CA expiry: status.certificates, CertificatesExpiring, the expiry metric
    renewal      spec.caRotation: one ca-rotation TalosOperation per renewal period of a CA, RotationDue
    (docs/decisions.md#rotation-state) operations   one step of each operation of the cluster, through the registry (the
    actor names no kind) machines     keep every approved machine on its render, apply safe differences, report the rest

The outcome of each phase is logged and counted here, in one place. Steps are short: waits are requeues.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from ichord.actors.machine_index import ByCluster
from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.api.names import ReadyReason
from ichord.api.views import ClusterView, MachineSpecError, MachineView, OperationView, operations_of
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import Forbidden, KubeError, NotFound
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.forbidden import forbidden_message
from ichord.kube.reads import label_secret
from ichord.kube.status import update_status
from ichord.machines.memo import ConfigMemo
from ichord.machines.reconciler import OWNED_FIELDS, MachineResult, reconcile_machine
from ichord.metrics import RECONCILE_OUTCOMES
from ichord.operations import guard, op_status
from ichord.operations.backbone import OperationKind
from ichord.operations.bundle_source import BundleSourceError
from ichord.operations.cert_expiry import DEFAULT_WARNING_DAYS, expiry_pass, forget_cluster
from ichord.operations.kinds import default_registry
from ichord.operations.op_status import Transition
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue, describe, earliest, soonest
from ichord.operations.registry import Registry
from ichord.operations.renewal import RenewalPass
from ichord.operations.scope import ClusterScope, TrustHooks
from ichord.pki.bundle import SecretsBundle
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.watchers.informer import Informer
from ichord.watchers.managed_nodes import NodeWatch
from ichord.watchers.written import ReadYourWrites

log = structlog.get_logger("ichord.actors.cluster")
Obj = dict[str, Any]

MAX_PARALLEL_MACHINES = 4
#: Ready reasons of the TalosCluster for a bundle that cannot be used (BundleSourceError reasons are the same).
_UNUSABLE_BUNDLE = {BundleSourceError.SECRET_NOT_FOUND, BundleSourceError.INVALID,
                    BundleSourceError.CROSS_NAMESPACE_REFUSED, BundleSourceError.FORBIDDEN}
#: Machine Ready reasons that say the same as the cluster's (the rest of the unusable bundles are BundleInvalid).
_MACHINE_REASON_AS_CLUSTER = {ReadyReason.FORBIDDEN}


@dataclass
class Runtime:
    """What every cluster actor of this process shares."""

    kube: KubeClient
    namespace: str  # the controller namespace: the leader Lease (bundle Secrets and locks: each cluster's own)
    clusters: Informer
    machines: Informer
    operations: Informer
    recorder: EventRecorder
    timing: Timing
    resync: float = 300.0  # how often a converged machine's node is read again (drift)
    warning_days: float = DEFAULT_WARNING_DAYS  # --certificate-expiry-warning-days
    registry: Registry = field(default_factory=default_registry)
    trust: TrustHooks = field(default_factory=TrustHooks)
    #: Namespaces other than a cluster's own that its secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    #: Tells a cluster's actor (namespace, name) that ``obj`` changed (the Router's tell; set by whoever runs the
    #: actors): what a step waits on outside ichord's own objects (ClusterScope.watch_nodes).
    wake: Callable[[str, str, tuple[str, str], str], None] = lambda _ns, _name, _obj, _reason: None
    #: Each cluster's machines, from the machines informer's events (a step never scans the whole fleet).
    machine_index: ByCluster = field(init=False, repr=False)
    #: Each cluster's operations, likewise.
    operation_index: ByCluster = field(init=False, repr=False)
    #: The operations as this process last wrote them, until the informer has caught up (watchers/written.py).
    operations_written: ReadYourWrites = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.machine_index = ByCluster(self.machines)
        self.operation_index = ByCluster(self.operations)
        self.operations_written = ReadYourWrites(self.operations)
        self.kube.on_written(names.PLURALS[names.TALOS_OPERATION], self.operations_written.note)

    def operations_of(self, namespace: str, cluster: str) -> list[OperationView]:
        """The cluster's operations, oldest first, from the informer's cache read through this process's own writes:
        no request (docs/architecture.md#read-your-writes says why that is as safe as the LIST it replaced)."""
        keys = self.operation_index.keys(namespace, cluster) | set(self.operations_written.keys(namespace))
        found = (self.operations_written.get(key) for key in keys)
        # Copies, as a LIST gave: a step's kinds may change what they hold; the cache must not change with it.
        return operations_of([copy.deepcopy(obj) for obj in found if obj is not None], namespace, cluster)


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
        #: Machine name -> (what its last reconcile saw, when it is due again): a machine whose inputs did not change
        #: is not read again before its own requeue (its resync), however often the cluster steps (a config rollout
        #: steps many times a minute, and read every waiting node's configuration each time).
        self._due: dict[str, tuple[tuple[object, ...], float]] = {}
        #: The TalosCluster as this step last wrote it: the next status write starts from it, not from a GET.
        self._written: Obj | None = None
        #: 403s on status writes already told by a Warning (object key, message): a refused status write cannot
        #: carry its own condition, so its one Warning is remembered here instead of in the object.
        self._denied: set[tuple[str, str]] = set()

    def close(self) -> None:
        if self._talos is not None:
            self._talos.close()

    def _watch_nodes(self, client: KubeClient) -> NodeWatch:
        """A watch of this cluster's managed Nodes through ``client`` that wakes this actor when one is back."""
        return NodeWatch(client, functools.partial(self.rt.wake, self.namespace, self.name), self.rt.timing)

    # ---- the step -------------------------------------------------------------------------

    async def step(self, messages: dict[Hashable, str]) -> Outcome:
        outcome = await self._step(messages)
        idle = _idle_for(outcome)
        if self._talos is not None and (idle is None or idle >= self.rt.timing.talos_channel_keep):
            # Idle until the drift resync (minutes): holding a channel per machine costs memory and fds for
            # nothing; a 4,000-machine fleet held 1.6 GiB that way. The client goes too (its TLS context and
            # minted certificate, ~25 KiB a cluster); the next step mints and dials afresh.
            self._talos.close()
            self._talos = None
        return outcome

    async def _step(self, messages: dict[Hashable, str]) -> Outcome:
        self._written = None
        scope = self._scope()
        if scope.cluster is None:
            await self._cluster_missing(scope)
            return self._record("cluster", Done())
        expiry = self._record("expiry", await self._expiry(scope, messages))
        renewal = self._record("renewal", await self._renewal(scope))
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
                            allowed_secret_namespaces=self.rt.allowed_secret_namespaces,
                            watch_nodes=self._watch_nodes)

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
                on_written=self._wrote,
            )
            self._expiry_due = now + delay
        return Requeue(max(0.0, self._expiry_due - now), "expiry re-read")

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

        renewal = RenewalPass(self.rt.kube, self.rt.recorder, ClusterView.of(self._written or scope.cluster.obj),
                              scope.operations, self.rt.timing.retry, scope.now(), self._wrote, created)
        return await renewal.run(public_bundle)

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
            await self._blocked(cluster, machines, ReadyReason.INVALID_SPEC,
                                f"the TalosCluster spec is invalid: {exc}")
            return Done()  # only a spec change can fix it
        bundle = await self._bundle(scope)
        if bundle is None:
            return Requeue(self.rt.timing.retry, "bundle unreadable")
        before = find(cluster.status.get("conditions"), names.READY)
        if await self._set_cluster_ready(cluster.obj, Condition(names.READY, "True", "Reconciled",
                                                                "the bundle is readable")) and (
                before is not None and before.get("reason") in _UNUSABLE_BUNDLE):
            # The bundle just became usable (it was missing or invalid): publish expiry now, not at its retry.
            # A cluster's first Ready needs no second pass: this step's expiry phase read the same bundle.
            self._expiry_due = None
            await self._expiry(scope, {})
        talos = self._client(bundle)
        held_by = scope.machines_held_by  # as the operations phase left it in this step
        planned = self.rt.registry.planned(scope)  # reboots/restarts ichord asked for: a loss that is no fault
        now = scope.now()

        results: dict[tuple[str, str], MachineResult] = {}
        limiter = anyio.CapacityLimiter(MAX_PARALLEL_MACHINES)
        bundle_version = (await scope.bundle()).resource_version
        clock = time.monotonic()
        not_due: dict[str, float] = {}

        def seen(m: MachineView) -> tuple[object, ...]:
            # Everything reconcile_machine decides from, but the node itself (read again at the machine's resync):
            # its object, the cluster's spec, the bundle, the operation holding the machines, its planned disruption.
            return (m.metadata.get("resourceVersion"), m.generation, cluster.generation, bundle_version,
                    held_by.name if held_by is not None else None, planned.get(m.name))

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
                )
            after = results[m.key].requeue_after
            if after is None:
                self._due.pop(m.name, None)
            else:
                self._due[m.name] = (seen(m), clock + after)

        self._memo.bound(len(machines))  # an entry per machine at most: what deleted machines left goes
        for gone in set(self._due) - {m.name for m in machines}:
            del self._due[gone]
        async with anyio.create_task_group() as tg:
            for m in machines:
                if m.approved:
                    tg.start_soon(one, m)
        delays: list[float | None] = []
        for m in machines:
            if not m.approved:
                await self._write_machine(
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
            if m.name in not_due:  # nothing it depends on changed since its last reconcile: nothing to write
                delays.append(not_due[m.name])
                continue
            result = results[m.key]
            await self._write_machine(m, result)
            delays.append(result.requeue_after)
        delay = earliest(*delays)
        return Done() if delay is None else Requeue(delay, "machines")

    async def _bundle(self, scope: ClusterScope) -> SecretsBundle | None:
        """The full bundle for rendering; a missing or invalid one is reported on the cluster and its machines."""
        assert scope.cluster is not None
        try:
            read = await scope.bundle()
            bundle = read.full()
        except BundleSourceError as exc:
            if exc.reason in _UNUSABLE_BUNDLE:
                await self._blocked(scope.cluster, scope.machines, exc.reason, exc.message)
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
            await self._blocked(scope.cluster, scope.machines, ReadyReason.FORBIDDEN,
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

    # ---- a cluster that does not exist -------------------------------------------------------

    async def _cluster_missing(self, scope: ClusterScope) -> None:
        forget_cluster(self.namespace, self.name)
        self._expiry_due = None
        message = f"TalosCluster {self.key} does not exist; create it or fix spec.clusterRef.name"
        try:
            await guard.release_machines(self.rt.kube, scope.machines)  # no operation of a missing cluster runs
        except IchordError as exc:
            log.warning("cannot let go of the machines of a missing cluster", cluster=self.key,
                        error=SCRUBBER.exception(exc))
        await self._operations_without_cluster(scope, message)
        for m in scope.machines:
            await self._write_machine(
                m,
                MachineResult(
                    Condition(names.READY, "False", ReadyReason.CLUSTER_NOT_FOUND, message),
                    event=("Warning", ReadyReason.CLUSTER_NOT_FOUND, message),
                ),
            )

    async def _operations_without_cluster(self, scope: ClusterScope, message: str) -> None:
        """Every unfinished TalosOperation naming this missing cluster says so (a typo must not be silent).

        Not started: phase Pending; started (the cluster was deleted under it): Paused. The condition is the
        kind's own, reason ClusterNotFound, with one Warning Event when it is first set. The cluster's
        creation wakes this actor, and the operation's own step then replaces the condition.
        """
        for op in self.rt.operations_of(self.namespace, self.name):
            if op.finished:
                continue
            current = op.condition()
            if current is not None and current.get("reason") == names.EventReason.CLUSTER_NOT_FOUND:
                continue
            # Decided on the object as read for the write, not the informer's copy: a status written in between
            # (the operation finished, or already says so) is never overwritten by a stale view.
            change = Transition(Condition(op.condition_type, "False", names.EventReason.CLUSTER_NOT_FOUND, message),
                                phase=_pending_or_paused, event=("Warning", names.EventReason.CLUSTER_NOT_FOUND),
                                generation=True, unfinished_only=True)
            try:
                _, moved = await op_status.transition(self.rt.kube, self.rt.recorder, scope.now, op.obj, change,
                                                      current=op.obj)
            except NotFound:
                continue
            except IchordError as exc:
                log.warning("operation status write failed", cluster=self.key, operation=op.name,
                            error=SCRUBBER.exception(exc))
                continue
            if moved:  # else written meanwhile: finished, or already saying so (and its one Warning posted)
                log.warning("operation names a cluster that does not exist", cluster=self.key, operation=op.name)

    # ---- writes (the one place) -------------------------------------------------------------

    async def _blocked(self, cluster: ClusterView, machines: list[MachineView], reason: str, message: str) -> None:
        changed = await self._set_cluster_ready(cluster.obj, Condition(names.READY, "False", reason, message))
        if changed:
            self.rt.recorder.record(ObjectRef.of(cluster.obj), "Warning", reason, message)
        for m in machines:
            if m.approved:
                await self._write_machine(
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

    def _wrote(self, cluster: Obj) -> None:
        self._written = cluster

    async def _set_cluster_ready(self, cluster: Obj, cond: Condition) -> bool:
        """Set the TalosCluster's Ready condition; True when it changed.

        The write starts from the object this step wrote last, else from ``cluster`` (the informer's): one
        PATCH, no GET. A copy that is stale by then costs a 409 and a fresh read, never a lost update.
        """
        cluster = self._written or cluster
        view = ClusterView.of(cluster)
        current = find(view.status.get("conditions"), names.READY)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == (
            cond.status,
            cond.reason,
            SCRUBBER.text(cond.message),
        ):
            return False
        generation = view.generation

        def mutate(status: Obj, _obj: Obj) -> Obj:
            status["conditions"] = set_condition(status.get("conditions"),
                                                 cond, observed_generation=generation)
            status["observedGeneration"] = generation
            return status

        try:
            self._written = await update_status(crds.clusters(self.rt.kube), self.namespace, self.name, mutate,
                                                current=cluster)
        except NotFound:
            return False
        except Forbidden as exc:
            self._status_refused(ObjectRef.of(cluster), exc)
            return False
        return True

    def _status_refused(self, ref: ObjectRef, exc: Forbidden) -> None:
        """A 403 on an object's own status write: the condition cannot be written, so one Warning Event on the
        object says what was refused and which chart value grants it (and the log, once)."""
        key = f"{ref.kind} {ref.namespace}/{ref.name}"
        message = f"this object's status cannot be written: {forbidden_message(exc)}"
        if (key, message) in self._denied:
            return
        self._denied.add((key, message))
        log.warning("status write refused", cluster=self.key, object=key, error=message)
        self.rt.recorder.record(ref, "Warning", names.EventReason.FORBIDDEN, message)

    async def _write_machine(self, m: MachineView, result: MachineResult, *, post: bool = True) -> None:
        old_ready = find(m.status.get("conditions"), names.READY)
        desired_fields = {k: v for k, v in result.fields.items() if k in OWNED_FIELDS}
        same_ready = old_ready is not None and (
            old_ready.get("status"),
            old_ready.get("reason"),
            old_ready.get("message"),
        ) == (result.ready.status, result.ready.reason, SCRUBBER.text(result.ready.message))
        same_fields = all(m.status.get(k, [] if k.endswith("Paths") else None) == v for k, v in desired_fields.items())
        if same_ready and same_fields and m.status.get("observedGeneration") == m.generation:
            return

        def mutate(status: Obj, _obj: Obj) -> Obj:
            status["conditions"] = set_condition(
                status.get("conditions"), result.ready, observed_generation=m.generation
            )
            status.update(desired_fields)
            status["observedGeneration"] = m.generation
            return status

        try:
            await update_status(crds.machines(self.rt.kube), m.namespace, m.name, mutate,
                                current=self.rt.machines.cache.get((m.namespace, m.name)))
        except NotFound:
            return
        except Forbidden as exc:
            self._status_refused(ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), exc)
            return
        except IchordError as exc:
            log.warning("machine status write failed", cluster=self.key, machine=m.name,
                        error=SCRUBBER.exception(exc))
            return
        reason_changed = old_ready is None or old_ready.get("reason") != result.ready.reason
        if post and result.event is not None and (reason_changed or result.applied):
            type_, reason, message = result.event
            self.rt.recorder.record(
                ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), type_, reason, message
            )


def _pending_or_paused(op: OperationView) -> str:
    """An operation whose cluster is missing: Paused once started (its stage kept), else Pending."""
    return names.Phase.PAUSED if op.stage else names.Phase.PENDING
