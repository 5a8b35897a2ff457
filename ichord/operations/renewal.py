"""Rotations planned from expiry: the TalosCluster's ``spec.caRotation`` policy (docs/decisions.md#renewal-policy).

Each step of the cluster's actor, after the expiry phase and before the operations phase, compares the CAs of
the live bundle (the step's one uncached read of the Secret, shared with the other phases) with the policy:

    no renewBefore anywhere        nothing (a RotationDue left from an earlier policy is lowered once)
    a value a new CA cannot meet   RotationDue False/InvalidRenewBefore; nothing is planned
    no CA inside its period        RotationDue False/NotDue, naming the next CA and when it enters its period
    CAs due, the planned one exists (by name)   RotationDue True: AwaitingApproval / RotationUnderWay /
                                                RotationFailed, from that operation's state
    CAs due, another operation unfinished       True/WaitingForOperation (or its state, when it is a ca-rotation
                                                that covers every due CA); nothing is created
    CAs due, nothing planned       create ONE ca-rotation for the due CAs, then RotationDue True naming it,
                                   one Normal Event RotationPlanned

The operation's name is derived from the cluster, the due targets and their CAs' fingerprints: a daemon killed
between the create and the condition write, or a new leader, finds it by name in its next step's uncached LIST
(or gets AlreadyExists) and never makes a second; a later renewal period of new CAs has other fingerprints and so
another name. The RotationPlanned Event goes with the condition write that first names the operation, so a kill
after the create still posts it once.

approval Manual creates the operation with ``spec.paused: true`` (plan only); Automatic creates it unpaused, and
it starts at once; its passes wait for the cluster's next maintenance window when it has windows
(docs/decisions.md#maintenance-windows). Either way a rotation of the talos or kubernetes CA stops at
AwaitingCredentials for the operator.
Nothing here is a Warning (the rotation is planned, not a fault) except a create the API refuses.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from ichord.api import names
from ichord.api.conditions import Condition, find, now_rfc3339, set_condition
from ichord.api.names import RotationDueReason
from ichord.api.views import ClusterView, OperationView
from ichord.contract import UnsupportedContractError, VersionContract, parse_contract
from ichord.errors import IchordError
from ichord.failpoints import failpoint
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import AlreadyExists, Forbidden, KubeError, NotFound, Unavailable
from ichord.kube.events import NORMAL, WARNING, EventRecorder, ObjectRef
from ichord.kube.forbidden import forbidden_message
from ichord.kube.status import update_status
from ichord.operations.outcome import Done, Outcome, Requeue
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CA_VALIDITY
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import RotationError, Target, parse_targets, target_order
from ichord.pki.scrub import SCRUBBER
from ichord.render.stages import StageRenderError, check_targets

log = structlog.get_logger("ichord.operations.renewal")
Obj = dict[str, Any]

MANUAL, AUTOMATIC = "Manual", "Automatic"
#: The CRD's pattern for a renewBefore value: whole numbers with units d, h, m, s ("30d", "1d12h").
_DURATION = re.compile(r"^(?:[1-9][0-9]*[dhms])+$")
_PART = re.compile(r"([1-9][0-9]*)([dhms])")
_UNITS = {"d": dt.timedelta(days=1), "h": dt.timedelta(hours=1), "m": dt.timedelta(minutes=1),
          "s": dt.timedelta(seconds=1)}
_HASH_LEN = 10


class RenewalPolicyError(IchordError):
    """spec.caRotation cannot be followed (the CRD's pattern was bypassed, or a value no new CA can meet)."""


def parse_duration(text: str) -> dt.timedelta:
    """``30d``, ``720h``, ``1d12h``, ``90s`` -> a timedelta; anything else is a RenewalPolicyError."""
    if not _DURATION.match(text):
        raise RenewalPolicyError(f"{text!r} is not a duration: write whole numbers with units d, h, m or s, such "
                                 "as 30d, 720h or 1d12h")
    return sum((int(n) * _UNITS[u] for n, u in _PART.findall(text)), dt.timedelta())


@dataclass(frozen=True)
class Policy:
    """The effective renewal period of each CA that has one, as parsed and as written (for messages)."""

    periods: dict[Target, tuple[dt.timedelta, str]]
    approval: str = MANUAL

    @classmethod
    def from_spec(cls, spec: Obj) -> Policy | None:
        """None when the spec sets no renewBefore at all; RenewalPolicyError when a value cannot be followed."""
        section = spec.get("caRotation") or {}
        if not isinstance(section, dict):
            raise RenewalPolicyError("spec.caRotation must be an object")
        default = section.get("renewBefore")
        by_target = section.get("renewBeforeByTarget") or {}
        if default is None and not by_target:
            return None
        periods: dict[Target, tuple[dt.timedelta, str]] = {}
        for target in target_order():
            text = by_target.get(target.value, default)
            if text is None:
                continue
            field = (f"spec.caRotation.renewBeforeByTarget.{target.value}" if target.value in by_target
                     else "spec.caRotation.renewBefore")
            try:
                period = parse_duration(str(text))
            except RenewalPolicyError as exc:
                raise RenewalPolicyError(f"{field}: {exc}") from None
            if period >= CA_VALIDITY:
                raise RenewalPolicyError(
                    f"{field} {text} is not shorter than a new CA's lifetime ({CA_VALIDITY.days}d): every CA a "
                    "rotation makes would be due at once")
            periods[target] = (period, str(text))
        unknown = sorted(set(by_target) - {t.value for t in target_order()})
        if unknown:
            raise RenewalPolicyError(f"spec.caRotation.renewBeforeByTarget names no CA target: {', '.join(unknown)}")
        approval = str(section.get("approval") or MANUAL)
        if approval not in (MANUAL, AUTOMATIC):
            raise RenewalPolicyError(f"spec.caRotation.approval {approval!r} is neither {MANUAL} nor {AUTOMATIC}")
        return cls(periods, approval)


@dataclass(frozen=True)
class DueCA:
    target: Target
    not_after: dt.datetime
    fingerprint: str
    renew_before: str  # as written

    def describe(self, now: dt.datetime) -> str:
        verb = "expired on" if self.not_after <= now else "expires on"
        return f"{self.target.value} ({verb} {now_rfc3339(self.not_after)}, renewBefore {self.renew_before})"


@dataclass(frozen=True)
class Schedule:
    """Which CAs are due at ``now``, which one enters its period next and when, and what the contract leaves out."""

    due: tuple[DueCA, ...]
    next_due: tuple[DueCA, dt.datetime] | None
    left_out: tuple[Target, ...]


def schedule(bundle: SecretsBundle, policy: Policy, now: dt.datetime, contract: VersionContract | None) -> Schedule:
    due: list[DueCA] = []
    upcoming: list[tuple[dt.datetime, DueCA]] = []
    left_out: list[Target] = []
    for target, (period, text) in policy.periods.items():
        if contract is not None:
            try:
                check_targets((target,), contract)
            except StageRenderError:
                left_out.append(target)  # the aggregator before v1.14: ichord cannot rotate it there
                continue
        ca = bundle.ca(target.ca_kind)
        entry = DueCA(target, ca.not_after, ca_fingerprint(ca), text)
        starts = ca.not_after - period
        if now >= starts:
            due.append(entry)
        else:
            upcoming.append((starts, entry))
    first = min(upcoming, key=lambda u: u[0]) if upcoming else None
    return Schedule(tuple(due), (first[1], first[0]) if first else None, tuple(left_out))


def operation_name(cluster: str, due: Iterable[DueCA]) -> str:
    """``<cluster>-renew-<10 hex>``: the hash of the cluster, the due targets and their CAs' fingerprints."""
    material = "\n".join([cluster, *(f"{d.target.value}={d.fingerprint}" for d in due)])
    digest = hashlib.sha256(material.encode()).hexdigest()[:_HASH_LEN]
    suffix = f"-renew-{digest}"
    return f"{cluster[:63 - len(suffix)].rstrip('-.')}{suffix}"


def operation_body(cluster: ClusterView, name: str, due: tuple[DueCA, ...], approval: str) -> Obj:
    return {
        "apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION,
        "metadata": {
            "name": name, "namespace": cluster.namespace,
            "labels": {names.PLANNED_BY_LABEL: names.PLANNED_BY_RENEWAL},
            "annotations": {names.RENEWS_ANNOTATION: ",".join(f"{d.target.value}={now_rfc3339(d.not_after)}"
                                                              for d in due)},
            # Found from its cluster, and collected with it (a paused plan of a deleted cluster is worth nothing).
            "ownerReferences": [{"apiVersion": names.API_VERSION, "kind": names.TALOS_CLUSTER, "name": cluster.name,
                                 "uid": cluster.uid}],
        },
        "spec": {"clusterRef": {"name": cluster.name}, "kind": names.KIND_CA_ROTATION,
                 "paused": approval != AUTOMATIC, "caRotation": {"targets": [d.target.value for d in due]}},
    }


def start_command(namespace: str, operation: str) -> str:
    return (f"kubectl -n {namespace} patch talosoperation {operation} --type merge -p "
            "'{\"spec\":{\"paused\":false}}'")


def _targets_of(op: OperationView) -> frozenset[Target]:
    try:
        return frozenset(parse_targets(list((op.spec.get("caRotation") or {}).get("targets") or []) or None))
    except RotationError:
        return frozenset()


_NAMES_PLANNED = (RotationDueReason.AWAITING_APPROVAL, RotationDueReason.ROTATION_UNDER_WAY)


def _waiting_on_approval(op: OperationView) -> bool:
    return op.paused and not op.stage and op.unfinished


# ---- the pure decision ------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    condition: Condition | None  # None: write nothing
    create: Obj | None = None  # the operation to create first (its name is in the condition)
    planned: str = ""  # the operation the policy planned that the condition names (for the Event)


def decide(cluster: ClusterView, policy: Policy, plan: Schedule, operations: list[OperationView],
           now: dt.datetime) -> Decision:
    ns, name = cluster.namespace, cluster.name
    status_cmd = f"`ichord cluster status {name} -n {ns}`"
    if not plan.due:
        if plan.next_due is not None:
            entry, starts = plan.next_due
            text = (f"No CA is inside its renewal period (spec.caRotation); the next is {entry.target.value}, on "
                    f"{now_rfc3339(starts)} (notAfter {now_rfc3339(entry.not_after)}, renewBefore "
                    f"{entry.renew_before}).")
        else:
            text = "No CA is inside its renewal period (spec.caRotation)."
        if plan.left_out:
            text += (f" Not planned on this cluster's contract: {', '.join(t.value for t in plan.left_out)} (only "
                     "the v1.14 contract rotates the aggregator CA).")
        return Decision(Condition(names.ROTATION_DUE, "False", RotationDueReason.NOT_DUE, text))
    cas = "; ".join(d.describe(now) for d in plan.due)
    head = f"CAs inside their renewal period: {cas}."
    wanted = frozenset(d.target for d in plan.due)
    own = operation_name(name, plan.due)
    mine = next((o for o in operations if o.name == own), None)
    if mine is not None:
        if mine.finished:
            text = (f"{head} TalosOperation {ns}/{own}, planned for them, ended {mine.phase} without renewing them: "
                    f"`kubectl -n {ns} describe talosoperation {own}` says why. Delete it (`kubectl -n {ns} delete "
                    f"talosoperation {own}`) and ichord plans the rotation again.")
            return Decision(Condition(names.ROTATION_DUE, "True", RotationDueReason.ROTATION_FAILED, text),
                            planned=own)
        return Decision(_covered(cluster, mine, head, status_cmd), planned=own)
    busy = [o for o in operations if o.unfinished or o.under_way]
    if busy:
        other = busy[0]
        if other.kind == names.KIND_CA_ROTATION and other.unfinished and wanted <= _targets_of(other):
            return Decision(_covered(cluster, other, head, status_cmd))
        text = (f"{head} TalosOperation {ns}/{other.name} ({other.kind}) of the cluster is unfinished; ichord plans "
                f"the rotation once it has ended ({status_cmd} shows it).")
        return Decision(Condition(names.ROTATION_DUE, "True", RotationDueReason.WAITING_FOR_OPERATION, text))
    body = operation_body(cluster, own, plan.due, policy.approval)
    return Decision(_covered(cluster, OperationView.of(body), head, status_cmd), create=body, planned=own)


def _covered(cluster: ClusterView, op: OperationView, head: str, status_cmd: str) -> Condition:
    """RotationDue True naming ``op``, the operation that rotates the due CAs (the policy's, or a person's)."""
    ns, name = cluster.namespace, cluster.name
    if _waiting_on_approval(op):
        planned = ((op.obj.get("metadata") or {}).get("labels") or {}).get(names.PLANNED_BY_LABEL)
        how = " (approval Manual)" if planned == names.PLANNED_BY_RENEWAL else ""
        text = (f"{head} TalosOperation {ns}/{op.name} rotates them; it is paused{how}. Review its plan (`kubectl "
                f"-n {ns} get talosoperation {op.name} -o yaml`), then start it: `{start_command(ns, op.name)}`.")
        return Condition(names.ROTATION_DUE, "True", RotationDueReason.AWAITING_APPROVAL, text)
    text = f"{head} TalosOperation {ns}/{op.name} rotates them; follow it with {status_cmd}."
    if any(t.description.hands_off for t in _targets_of(op)):
        text += f" It waits in AwaitingCredentials for `ichord cluster credentials {name} -n {ns} --acknowledge`."
    return Condition(names.ROTATION_DUE, "True", RotationDueReason.ROTATION_UNDER_WAY, text)


# ---- the pass against the API -----------------------------------------------------------------


def _same(old: Obj | None, cond: Condition) -> bool:
    return (old is not None and (old.get("status"), old.get("reason"), old.get("message"))
            == (cond.status, cond.reason, SCRUBBER.text(cond.message)))


@dataclass
class RenewalPass:
    """One step's renewal of a cluster: the inputs the actor holds, and where the written cluster goes."""

    kube: KubeClient
    recorder: EventRecorder
    cluster: ClusterView  # the latest copy this step has (the one the expiry phase wrote, else the informer's)
    operations: list[OperationView]
    retry: float  # seconds before a step whose create or write failed tries again
    now: dt.datetime
    on_written: Callable[[Obj], None]
    on_created: Callable[[Obj], None]

    @property
    def key(self) -> str:
        return f"{self.cluster.namespace}/{self.cluster.name}"

    async def run(self, read_bundle: Callable[[], Awaitable[SecretsBundle | None]]) -> Outcome:
        """``read_bundle``: the CA certificates of the live bundle (the step's one read), None when unreadable."""
        existing = find(self.cluster.status.get("conditions"), names.ROTATION_DUE)
        try:
            policy = Policy.from_spec(self.cluster.spec)
        except RenewalPolicyError as exc:
            text = (f"{exc}. Nothing is planned; fix it with `kubectl -n {self.cluster.namespace} edit taloscluster "
                    f"{self.cluster.name}`.")
            await self._write(Condition(names.ROTATION_DUE, "False", RotationDueReason.INVALID_RENEW_BEFORE, text))
            return Done()
        if policy is None:
            if existing is not None:  # the policy was removed: what RotationDue said last no longer holds
                await self._write(Condition(names.ROTATION_DUE, "False", RotationDueReason.NOT_DUE,
                                            "spec.caRotation sets no renewBefore: ichord plans no rotation."))
            return Done()
        if self.cluster.deleting:
            return Done()  # a deleted cluster plans nothing
        bundle = await read_bundle()
        if bundle is None:
            return Done()  # the cluster's Ready says why; the next step reads it again
        contract = None
        # An unknown contract: the cluster's Ready says so; every target is planned, the rotation refuses what it must.
        with contextlib.suppress(UnsupportedContractError):
            contract = parse_contract(str(self.cluster.spec.get("talosVersion") or "v1.14"))
        plan = schedule(bundle, policy, self.now, contract)
        decision = decide(self.cluster, policy, plan, self.operations, self.now)
        if decision.create is not None:
            refused = await self._create(decision.create)
            if refused is not None:
                if isinstance(refused, Condition):
                    if await self._write(refused):
                        self.recorder.record(ObjectRef.of(self.cluster.obj), WARNING, refused.reason,
                                             refused.message)
                    return Requeue(self.retry, "renewal operation not created")
                return Requeue(self.retry, "renewal operation create failed")
            failpoint("renewal.created")
        assert decision.condition is not None
        # The one Event goes with the first write naming the planned operation (a kill after the create included).
        said = existing is not None and existing.get("reason") in _NAMES_PLANNED and decision.planned in str(
            existing.get("message") or "")
        first = bool(decision.planned) and decision.condition.reason in _NAMES_PLANNED and not said
        if await self._write(decision.condition) and first:
            message = decision.condition.message
            if policy.approval == AUTOMATIC and decision.create is not None:
                # docs/decisions.md#renewal-policy: Automatic starts now; its passes wait for a maintenance window.
                message += (" Created unpaused (approval Automatic): it starts now"
                            + ("; its passes wait for the cluster's maintenance windows."
                               if (self.cluster.spec.get("maintenance") or {}).get("windows") else "."))
            self.recorder.record(ObjectRef.of(self.cluster.obj), NORMAL, names.EventReason.ROTATION_PLANNED, message)
            log.info("CA rotation planned", cluster=self.key, operation=decision.planned,
                     targets=[d.target.value for d in plan.due], approval=policy.approval)
        if plan.next_due is not None and not plan.due:
            return Requeue(max(0.0, (plan.next_due[1] - self.now).total_seconds()), "next CA renewal period")
        return Done()

    async def _create(self, body: Obj) -> Condition | str | None:
        """None when the operation exists now (created, or found by name); a Condition for a refusal a person must
        look at; a string for a transient failure (retried)."""
        name = str(body["metadata"]["name"])
        ns = self.cluster.namespace
        try:
            created = await crds.operations(self.kube).create(ns, body)
        except AlreadyExists:
            created = None  # a step before a kill (or another leader) made it: the same name, the same CAs
        except Forbidden as exc:
            return Condition(names.ROTATION_DUE, "True", RotationDueReason.OPERATION_NOT_CREATED,
                             f"CAs are inside their renewal period but TalosOperation {ns}/{name} could not be "
                             f"created: {forbidden_message(exc, cluster_namespace=ns)}")
        except (Unavailable, NotFound) as exc:
            log.warning("renewal operation not created; retried", cluster=self.key, operation=name,
                        error=SCRUBBER.exception(exc))
            return "unavailable"
        except KubeError as exc:
            if exc.status == 0 or exc.status >= 500 or exc.retryable:
                log.warning("renewal operation not created; retried", cluster=self.key, operation=name,
                            error=SCRUBBER.exception(exc))
                return "server error"
            return Condition(names.ROTATION_DUE, "True", RotationDueReason.OPERATION_NOT_CREATED,
                             f"CAs are inside their renewal period but the API refused TalosOperation {ns}/{name}: "
                             f"{SCRUBBER.exception(exc)}. Create the rotation by hand: `ichord cluster rotate "
                             f"{self.cluster.name} -n {ns}`.")
        if created is not None:
            self.on_created(created)
        return None

    async def _write(self, cond: Condition) -> bool:
        """Set RotationDue (only when it changed); True when written."""
        if _same(find(self.cluster.status.get("conditions"), names.ROTATION_DUE), cond):
            return False
        generation = self.cluster.generation

        def mutate(status: Obj, _obj: Obj) -> Obj | None:
            if _same(find(status.get("conditions"), names.ROTATION_DUE), cond):
                return None
            status["conditions"] = set_condition(status.get("conditions"), cond, observed_generation=generation,
                                                 now=self.now)
            return status

        try:
            obj = await update_status(crds.clusters(self.kube), self.cluster.namespace, self.cluster.name, mutate,
                                      current=self.cluster.obj)
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("RotationDue not written; retried", cluster=self.key, error=SCRUBBER.exception(exc))
            return False
        self.cluster = ClusterView.of(obj)
        self.on_written(obj)
        return True
