"""One step of a cluster actor: everything done to one TalosCluster, re-derived from the API and nodes.

For now a step reconciles the cluster's machines (ichord.machines); operations join it in later
issues. A step is short: it reads the bundle Secret uncached, asks each approved machine's node
what it runs (bounded fan-out), applies safe differences, and writes each status that changed —
in one place, through the status patch helper.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition, set_operation_phase
from ichord.api.names import ReadyReason
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.reads import label_secret, read_secret
from ichord.kube.status import update_status
from ichord.machines.reconciler import OWNED_FIELDS, MachineResult, reconcile_machine
from ichord.machines.view import MachineSpecError, MachineView
from ichord.operations.ca_rotation import RotationContext, is_ca_rotation
from ichord.operations.ca_rotation import advance as advance_ca_rotation
from ichord.operations.cert_expiry import DEFAULT_WARNING_DAYS, expiry_pass, forget_cluster
from ichord.operations.outcome import Blocked, Done, Outcome, Requeue, earliest, next_delay
from ichord.pki.bundle import BundleError, SecretsBundle
from ichord.pki.fingerprint import export_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.render.errors import RenderError
from ichord.render.inputs import ClusterInputs
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.trust import rotation_refusal, rotation_trust_hook
from ichord.watchers.informer import Informer

log = structlog.get_logger("ichord.actors.cluster")
Obj = dict[str, Any]

MAX_PARALLEL_MACHINES = 4


@dataclass
class Runtime:
    """What every cluster actor of this process shares."""

    kube: KubeClient
    namespace: str  # the controller namespace: bundle Secrets and Leases live here
    clusters: Informer
    machines: Informer
    operations: Informer
    recorder: EventRecorder
    timing: Timing
    resync: float = 300.0  # how often a converged machine's node is read again (drift)
    warning_days: float = DEFAULT_WARNING_DAYS  # --certificate-expiry-warning-days


def cluster_of(obj: Obj) -> str | None:
    ref = (obj.get("spec") or {}).get("clusterRef") or {}
    name = ref.get("name")
    return str(name) if name else None


def rotation_under_way(op: Obj) -> bool:
    """A ca-rotation with a stage set that has not completed (ADR 0063)."""
    spec, status = op.get("spec") or {}, op.get("status") or {}
    stage = (status.get("caRotation") or {}).get("stage") or ""
    return spec.get("kind") == "ca-rotation" and bool(stage) and status.get("phase") != "Completed" and stage != "Done"


def _combine(outcome: Outcome, expiry_in: float) -> Outcome:
    """The machines' outcome, woken no later than the next expiry read."""
    if isinstance(outcome, Requeue):
        return Requeue(min(outcome.after, expiry_in), outcome.reason)
    if isinstance(outcome, Done):
        return Requeue(expiry_in, "expiry re-read")
    return outcome


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
        self._talos: TalosClient | None = None
        self._registered_bundle: str | None = None
        # Parsing a bundle checks its RSA-4096 key (~0.3 s of CPU): reuse it while the bytes are the same.
        self._bundle_cache: tuple[bytes, SecretsBundle] | None = None
        self._expiry_due: float | None = None

    def close(self) -> None:
        if self._talos is not None:
            self._talos.close()

    # ---- the step -------------------------------------------------------------------------

    async def step(self, messages: dict[Hashable, str]) -> Outcome:
        outcome = await self._step(messages)
        idle = _idle_for(outcome)
        if self._talos is not None and (idle is None or idle >= self.rt.timing.talos_channel_keep):
            # Idle until the drift resync (minutes): holding a channel per machine costs memory and fds for
            # nothing; a 4,000-machine fleet held 1.6 GiB that way. The client redials on the next step.
            self._talos.close()
        return outcome

    async def _step(self, messages: dict[Hashable, str]) -> Outcome:
        cluster = self.rt.clusters.get(self.namespace, self.name)
        machines = self._machines()
        if cluster is None:
            forget_cluster(self.namespace, self.name)
            self._expiry_due = None
            message = f"TalosCluster {self.namespace}/{self.name} does not exist; create it or fix spec.clusterRef.name"
            await self._operations_without_cluster(message)
            for m in machines:
                await self._write_machine(
                    m,
                    MachineResult(
                        Condition(names.READY, "False", ReadyReason.CLUSTER_NOT_FOUND, message),
                        event=("Warning", ReadyReason.CLUSTER_NOT_FOUND, message),
                    ),
                )
            return Done()
        expiry_in = await self._expiry(cluster, messages)
        rotation_in = await self._ca_rotation_phase()
        outcome = await self._machines_phase(cluster, machines)
        if rotation_in is not None:
            outcome = _combine(outcome, rotation_in)
        return _combine(outcome, expiry_in)

    async def _expiry(self, cluster: Obj, messages: dict[Hashable, str]) -> float:
        """CA expiry as its own phase, first in the step so slow machine work never delays it."""
        now = time.monotonic()
        # A change of the cluster or of its bundle Secret (its informer) reads expiry again at once.
        cluster_changed = any(isinstance(k, tuple) and k and k[0] in (names.TALOS_CLUSTER, "Secret") for k in messages)
        if self._expiry_due is None or now >= self._expiry_due or cluster_changed:
            delay = await expiry_pass(
                self.rt.kube,
                cluster,
                namespace_of_secret=self.rt.namespace,
                recorder=self.rt.recorder,
                timing=self.rt.timing,
                warning_days=self.rt.warning_days,
            )
            self._expiry_due = now + delay
        return max(0.0, self._expiry_due - now)

    async def _machines_phase(self, cluster: Obj, machines: list[MachineView]) -> Outcome:
        spec = cluster.get("spec") or {}
        try:
            inputs = ClusterInputs.from_spec(str(spec.get("clusterName") or self.name), spec)
        except RenderError as exc:
            await self._blocked(cluster, machines, "InvalidSpec", f"the TalosCluster spec is invalid: {exc}")
            return Done()  # only a spec change can fix it
        bundle = await self._bundle(cluster, machines)
        if bundle is None:
            return Requeue(self.rt.timing.retry, "bundle unreadable")
        await self._set_cluster_ready(cluster, Condition(names.READY, "True", "Reconciled", "the bundle is readable"))
        talos = self._client(bundle)
        rotating = await self._rotation_under_way()

        results: dict[tuple[str, str], MachineResult] = {}
        limiter = anyio.CapacityLimiter(MAX_PARALLEL_MACHINES)

        async def one(m: MachineView) -> None:
            async with limiter:
                results[m.key] = await reconcile_machine(
                    talos,
                    bundle,
                    inputs,
                    m,
                    rotation_in_progress=rotating,
                    retry_after=self.rt.timing.retry,
                    resync_after=self.rt.resync,
                )

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
            result = results[m.key]
            await self._write_machine(m, result)
            delays.append(result.requeue_after)
        delay = earliest(*delays)
        return Done() if delay is None else Requeue(delay)

    # ---- the ca-rotation operation phase (ichord.operations.ca_rotation) -----------------------

    async def _ca_rotation_phase(self) -> float | None:
        """One step of each ca-rotation of this cluster, oldest first; the earliest wake-up asked for."""
        ops, _ = await crds.operations(self.rt.kube).list_objects(self.namespace)
        ours = sorted((op for op in ops if cluster_of(op) == self.name and is_ca_rotation(op)),
                      key=lambda op: str((op.get("metadata") or {}).get("creationTimestamp") or ""))
        ctx = RotationContext(self.rt.kube, self.rt.namespace, self.rt.recorder, self.rt.timing,
                              trust_hook=rotation_trust_hook, trust_refusal=rotation_refusal)
        delays = []
        for op in ours:
            finished = (op.get("status") or {}).get("phase") in ("Completed", "Failed")
            if finished and names.CA_ROTATION_FINALIZER not in ((op.get("metadata") or {}).get("finalizers") or []):
                continue
            delays.append(next_delay(await advance_ca_rotation(ctx, op)))
        return earliest(*delays)

    async def _operations_without_cluster(self, message: str) -> None:
        """Every unfinished TalosOperation naming this missing cluster says so (a typo must not be silent).

        Not started: phase Pending; started (the cluster was deleted under it): Paused. The condition is the
        kind's own, reason ClusterNotFound, with one Warning Event when it is first set. The cluster's
        creation wakes this actor, and the operation's own step then replaces the condition.
        """
        for (ns, name), op in sorted(self.rt.operations.cache.items()):
            status = op.get("status") or {}
            if ns != self.namespace or cluster_of(op) != self.name or status.get("phase") in ("Completed", "Failed"):
                continue
            ctype = names.OPERATION_CONDITION.get(str((op.get("spec") or {}).get("kind")), names.SUCCEEDED)
            current = find(status.get("conditions"), ctype)
            if current is not None and current.get("reason") == names.EventReason.CLUSTER_NOT_FOUND:
                continue
            started = bool((status.get("caRotation") or {}).get("stage"))
            cond = Condition(ctype, "False", names.EventReason.CLUSTER_NOT_FOUND, message)
            generation = int((op.get("metadata") or {}).get("generation") or 0)

            def mutate(st: Obj, _obj: Obj, cond: Condition = cond, started: bool = started,
                       generation: int = generation) -> Obj:
                set_operation_phase(st, "Paused" if started else "Pending", cond.message,
                                    observed_generation=generation)
                st["conditions"] = set_condition(st.get("conditions"), cond, observed_generation=generation)
                return st

            try:
                await update_status(crds.operations(self.rt.kube), ns, name, mutate, current=op)
            except NotFound:
                continue
            except IchordError as exc:
                log.warning("operation status write failed", cluster=f"{ns}/{self.name}", operation=name,
                            error=SCRUBBER.exception(exc))
                continue
            log.warning("operation names a cluster that does not exist", cluster=f"{ns}/{self.name}", operation=name)
            self.rt.recorder.record(ObjectRef.of(op), "Warning", names.EventReason.CLUSTER_NOT_FOUND, message)

    # ---- inputs ---------------------------------------------------------------------------

    def _machines(self) -> list[MachineView]:
        out = []
        for (ns, _name), obj in sorted(self.rt.machines.cache.items()):
            if ns != self.namespace or cluster_of(obj) != self.name:
                continue
            try:
                out.append(MachineView.of(obj))
            except MachineSpecError:
                continue
        return out

    async def _bundle(self, cluster: Obj, machines: list[MachineView]) -> SecretsBundle | None:
        secret_name = ((cluster.get("spec") or {}).get("secretsRef") or {}).get("name")
        where = f"Secret {self.rt.namespace}/{secret_name}"
        try:
            secret = await read_secret(self.rt.kube, self.rt.namespace, str(secret_name))
        except NotFound:
            await self._blocked(
                cluster,
                machines,
                "SecretNotFound",
                f"{where} (spec.secretsRef) does not exist; create it with the cluster's secrets.yaml",
            )
            return None
        except KubeError as exc:
            log.warning("bundle read failed", cluster=self.name, error=SCRUBBER.exception(exc))
            return None
        if names.BUNDLE_LABEL not in secret.labels:
            await self._label_bundle(secret_name=str(secret_name))
        raw = secret.data.get(names.SECRETS_KEY)
        if raw is None:
            await self._blocked(
                cluster, machines, names.ReadyReason.BUNDLE_INVALID, f"{where} has no key {names.SECRETS_KEY}"
            )
            return None
        if self._bundle_cache is not None and self._bundle_cache[0] == raw:
            return self._bundle_cache[1]
        try:
            bundle = SecretsBundle.from_yaml(raw, f"{where} key {names.SECRETS_KEY}")
        except BundleError as exc:
            await self._blocked(cluster, machines, names.ReadyReason.BUNDLE_INVALID, str(exc))
            return None
        self._bundle_cache = (raw, bundle)
        fp = export_fingerprint(bundle)
        if fp != self._registered_bundle:
            SCRUBBER.register_all(bundle.secret_values())
            self._registered_bundle = fp
        return bundle

    async def _label_bundle(self, secret_name: str) -> None:
        """Label the referenced Secret so the bundle informer sees its next change (once: then it carries it)."""
        try:
            await label_secret(self.rt.kube, self.rt.namespace, secret_name, {names.BUNDLE_LABEL: "true"})
        except KubeError as exc:
            log.warning("cannot label the bundle Secret; its changes are seen at the next resync instead",
                        cluster=f"{self.namespace}/{self.name}", secret=secret_name, error=str(exc))

    def _client(self, bundle: SecretsBundle) -> TalosClient:
        dial = DialBundle.from_bundle(bundle)
        if self._talos is None:
            self._talos = TalosClient(dial)
        else:
            self._talos.set_dial(dial)
        return self._talos

    async def _rotation_under_way(self) -> bool:
        # Uncached: a stale cache must not let the machine reconciler revert a rotation's stage.
        ops, _ = await crds.operations(self.rt.kube).list_objects(self.namespace)
        return any(cluster_of(op) == self.name and rotation_under_way(op) for op in ops)

    # ---- writes (the one place) -------------------------------------------------------------

    async def _blocked(self, cluster: Obj, machines: list[MachineView], reason: str, message: str) -> None:
        changed = await self._set_cluster_ready(cluster, Condition(names.READY, "False", reason, message))
        if changed:
            self.rt.recorder.record(ObjectRef.of(cluster), "Warning", reason, message)
        for m in machines:
            if m.approved:
                await self._write_machine(
                    m,
                    MachineResult(
                        Condition(
                            names.READY,
                            "False",
                            ReadyReason.BUNDLE_INVALID if reason != "InvalidSpec" else ReadyReason.RENDER_FAILED,
                            f"cluster {self.name}: {message}",
                        )
                    ),
                    post=False,
                )

    async def _set_cluster_ready(self, cluster: Obj, cond: Condition) -> bool:
        """Set the TalosCluster's Ready condition; True when it changed."""
        current = find((cluster.get("status") or {}).get("conditions"), names.READY)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == (
            cond.status,
            cond.reason,
            SCRUBBER.text(cond.message),
        ):
            return False
        generation = int((cluster.get("metadata") or {}).get("generation") or 0)

        def mutate(status: Obj, _obj: Obj) -> Obj:
            status["conditions"] = set_condition(status.get("conditions"), cond, observed_generation=generation)
            status["observedGeneration"] = generation
            return status

        try:
            await update_status(crds.clusters(self.rt.kube), self.namespace, self.name, mutate)
        except NotFound:
            return False
        return True

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
        except IchordError as exc:
            log.warning("machine status write failed", machine=m.name, error=SCRUBBER.exception(exc))
            return
        reason_changed = old_ready is None or old_ready.get("reason") != result.ready.reason
        if post and result.event is not None and (reason_changed or result.applied):
            type_, reason, message = result.event
            self.rt.recorder.record(
                ObjectRef(names.TALOS_MACHINE, m.namespace, m.name, m.uid, names.API_VERSION), type_, reason, message
            )
