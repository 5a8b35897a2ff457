"""Playing the operation on the twin: the real cluster actor step and registry, time compressed, everything seen.

The twin's Talos history (applies, reboots, kube-apiserver restarts), its managed API server's store (cordons,
evictions) and its management store (the operation's stage, its condition) are followed from the inside: watching
costs the twin no request and the live cluster nothing at all. Where a person must act the rehearsal says so and
plays that person in the twin only (the hand-off annotation, ``spec.paused``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.standalone import standalone_actor
from ichord.api import names
from ichord.api.conditions import find
from ichord.api.views import OperationView
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig_data
from ichord.kube.errors import BadRequest, Invalid
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.etcd_snapshot import STATUS_KEY as SNAPSHOT_KEY
from ichord.operations.etcd_snapshot import TAKEN as SNAPSHOT_TAKEN
from ichord.operations.outcome import next_delay
from ichord.pki.scrub import SCRUBBER
from ichord.rehearsal.live import RehearsalInputError
from ichord.rehearsal.model import SETTLES
from ichord.rehearsal.twin import Twin
from ichord.settings import Timing
from ichord.sim.kube.events import Change
from ichord.sim.kube.eviction import selector_matches
from ichord.sim.kube.resources import ResourceType
from ichord.sim.talos.node import Timings
from ichord.sim.talos.testing import fast_timings

Obj = dict[str, Any]

#: The twin's clocks: the daemon's Timing and the simulated delays are both this fraction of real time.
TIME_SCALE = 0.01
#: A stop that lasts this long in the twin (compressed seconds), or a Blocked cause the retry runs into again, is
#: one the real run would stay in.
STOP_AFTER = 3.0
#: How long the twin's machines may take to be reported before the operation is started anyway.
SETTLE_BUDGET = 30.0
#: Talos history kinds a timeline shows (the rest is the simulator's own bookkeeping).
#: A drain's refusal (operations/managed/drain.py): the pods whose eviction is still refused.
_REFUSED = re.compile(r"eviction of (.+?) is still refused")
NODE_EVENTS = frozenset({"apply", "reboot", "down", "boot", "apiserver_restart", "apiserver_ready"})


@dataclass(frozen=True)
class Event:
    """One thing that happened in the twin, at ``t`` compressed seconds after the operation was started."""

    t: float
    kind: str  # stage, apply, reboot, boot, apiserver_restart, apiserver_ready, cordon, uncordon, evict, settle, act,
    # snapshot, stop
    node: str = ""
    detail: str = ""


@dataclass
class Recording:
    """What the rehearsal saw: its events in order, the operation as it ended, and where it stopped."""

    events: list[Event] = field(default_factory=list)
    final: Obj = field(default_factory=dict)
    completed: bool = False
    stops: list[tuple[str, str, str]] = field(default_factory=list)  # (condition type, reason, message)


def timing(scale: float = TIME_SCALE) -> Timing:
    # The restart bounds stay above the simulators' one-second timestamp resolution (as the rotation tests keep
    # them): compressing them further would stop a rotation the real run carries through.
    # A request's timeout is a bound, not a wait: compressed to 0.3 s a loaded machine's twin API server times out
    # (the rehearsal then said the operation was refused); the unscaled bound changes no step's timing.
    return replace(Timing().scaled(scale), ca_client_restart_timeout=30.0, ca_apiserver_unchanged=2.0,
                   ca_apiserver_ready_bound=30.0, kube_request_timeout=Timing().kube_request_timeout)


def simulated_delays() -> Timings:
    """The simulators' own delays, in milliseconds: the predicted durations are the model's (model.py), so the
    twin only has to keep the order of things, not their length."""
    return fast_timings()


class Player:
    """Starts the operation on the twin and records it until it completes, fails, or stops for good."""

    def __init__(self, twin: Twin, operation: Obj, *, budget: float = 240.0) -> None:
        self.twin = twin
        self.operation = operation
        self.name = str(operation["metadata"]["name"])
        self.budget = budget
        self.rec = Recording()
        self._t0 = 0.0
        self._stage = ""
        self._cond: tuple[str, str, str] = ("", "", "")
        self._acted: set[str] = set()
        self._blocked: set[tuple[str, str, str]] = set()
        self._repeated: tuple[str, str, str] | None = None
        self._nodenames: dict[str, str] = {}
        self._snapshot_played = False

    def _now(self) -> float:
        return anyio.current_time() - self._t0

    def _add(self, kind: str, node: str = "", detail: str = "") -> None:
        self.rec.events.append(Event(round(self._now(), 4), kind, node, detail))

    # ---- listeners -------------------------------------------------------------------------

    def _on_talos(self, e: dict[str, Any]) -> None:
        if e.get("kind") in NODE_EVENTS and e.get("node"):
            detail = str(e.get("mode") or "") if e["kind"] == "apply" else ""
            self._add(str(e["kind"]), str(e["node"]), detail)

    def _on_managed(self, change: Change, rt: ResourceType) -> None:
        if rt.plural == "nodes":
            was = bool(((change.old or {}).get("spec") or {}).get("unschedulable"))
            now = bool((change.new.get("spec") or {}).get("unschedulable"))
            if was != now:
                node = self._nodenames.get(change.new["metadata"]["name"], change.new["metadata"]["name"])
                self._add("cordon" if now else "uncordon", node)
        elif rt.plural == "pods" and change.type == "DELETED":
            spec = change.new.get("spec") or {}
            meta = change.new.get("metadata") or {}
            if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}) or not spec.get("nodeName"):
                return
            node = self._nodenames.get(str(spec["nodeName"]), str(spec["nodeName"]))
            self._add("evict", node, f"{meta.get('namespace')}/{meta.get('name')}")

    def _on_management(self, change: Change, rt: ResourceType) -> None:
        if rt.plural != "talosoperations" or change.new["metadata"]["name"] != self.name:
            return
        view = OperationView.of(change.new)
        self._snapshot(change.new)
        if view.stage and view.stage != self._stage:
            self._stage = view.stage
            self._add("stage", detail=view.stage)
        cond = view.condition() or {}
        seen = (view.condition_type, str(cond.get("reason") or ""), str(cond.get("message") or ""))
        if cond and seen != self._cond:
            if seen[1] in SETTLES and seen[1] != self._cond[1]:
                self._add("settle", detail=seen[1])  # a wait by the clock: the model prices it (model.py)
            self._cond = seen
            if cond.get("status") == "False":
                if seen in self._blocked:
                    self._repeated = seen  # the retry ran into the same cause: the real run stays here
                    return
                self._blocked.add(seen)
                self._add("blocked", detail=f"{seen[1]}: {seen[2]}")
                for pdb in self._blocking_budgets(seen[2]):
                    self._add("pdb", detail=f"PodDisruptionBudget {pdb} allows no disruption")

    def _snapshot(self, op: Obj) -> None:
        """The etcd snapshot the real run takes before its first reboot, once the twin played it (its port wrote
        nothing: rehearsal/snapshots.py)."""
        status = op.get("status") or {}
        record = status.get(SNAPSHOT_KEY) or {}
        if self._snapshot_played or record.get("state") != SNAPSHOT_TAKEN:
            return
        self._snapshot_played = True
        retain = ((status.get("plan") or {}).get(SNAPSHOT_KEY) or {}).get("retain")
        kept = f", then keeps the cluster's newest {retain} there" if retain else ""
        self._add("snapshot", str(record.get("machine") or ""),
                  f"{record.get('path')}: the real run writes it{kept}; played here, nothing written")

    def _blocking_budgets(self, message: str) -> list[str]:
        """The twin's PodDisruptionBudgets that select a pod a drain's message says is refused eviction."""
        m = _REFUSED.search(message)
        if m is None:
            return []
        store = self.twin.kube.store
        pods_rt, pdb_rt = store.resolve("", "v1", "pods"), store.resolve("policy", "v1", "poddisruptionbudgets")
        out: list[str] = []
        for ref in m.group(1).replace(" and ", ", ").split(", "):
            ns, _, name = ref.strip().partition("/")
            pods = store.list(pods_rt, ns, lambda o, name=name: o["metadata"]["name"] == name)[0]  # type: ignore[misc]
            for pod in pods:
                labels = pod["metadata"].get("labels") or {}
                for pdb in store.list(pdb_rt, ns)[0]:
                    key = f"{ns}/{pdb['metadata']['name']}"
                    if key not in out and selector_matches((pdb.get("spec") or {}).get("selector"), labels):
                        out.append(key)
        return out

    # ---- the run ---------------------------------------------------------------------------

    async def play(self, tm: Timing) -> Recording:
        twin = self.twin
        self._nodenames = {n.nodename: name for name, n in twin.talos.nodes.items()}
        body = copy.deepcopy(self.operation)
        body["metadata"] = {"name": self.name, "namespace": twin.namespace}
        wanted_pause = bool((body.get("spec") or {}).get("paused"))
        body.setdefault("spec", {})["paused"] = False
        if wanted_pause:
            self._add("act", detail="the operation is created paused (plan only): a person sets spec.paused to false")
        twin.talos.history.listeners.append(self._on_talos)
        twin.kube.store.listeners.append(self._on_managed)
        twin.management.store.listeners.append(self._on_management)
        try:
            async with await from_kubeconfig_data(twin.kubeconfig_data(), what="the twin's kubeconfig",
                                                  timing=tm) as kube:
                await self._run(kube, body, tm)
        finally:
            twin.talos.history.listeners.remove(self._on_talos)
            twin.kube.store.listeners.remove(self._on_managed)
            twin.management.store.listeners.remove(self._on_management)
        return self.rec

    async def _run(self, kube: Any, body: Obj, tm: Timing) -> None:
        twin = self.twin
        ops = twin.management.store.resolve(names.GROUP, names.VERSION, names.PLURALS[names.TALOS_OPERATION])
        refused: RehearsalInputError | None = None
        async with standalone_actor(kube, twin.namespace, twin.cluster_name, tm, instance="rehearsal",
                                    etcd_snapshots=twin.etcd_snapshots) as reconciler:
            await self._settle(reconciler)
            self._t0 = anyio.current_time()
            try:
                await crds.operations(kube).create(twin.namespace, body)
            except (Invalid, BadRequest) as exc:  # the CRD's schema and rules, as the live API server applies them
                refused = RehearsalInputError(f"the operation is not one the API server accepts: "
                                              f"{SCRUBBER.exception(exc)}. Nothing was written.")
            else:
                await self._loop(reconciler, ops)
        if refused is not None:  # raised outside the task group: the command reports it as bad input (exit 2)
            raise refused

    async def _loop(self, reconciler: ClusterReconciler, ops: ResourceType) -> None:
        store = self.twin.management.store
        stopped_since: float | None = None
        with anyio.move_on_after(self.budget) as scope:
            while True:
                outcome = await reconciler.step({})
                op = store.get(ops, self.twin.namespace, self.name)
                self.rec.final = op
                view = OperationView.of(op)
                if view.phase == names.Phase.COMPLETED:
                    self.rec.completed = True
                    return
                if view.phase == names.Phase.FAILED:
                    self._stop(view)
                    return
                self._hand_off(op, view)
                if self._repeated is not None:
                    self.rec.stops.append(self._repeated)
                    self._add("stop", detail=f"{self._repeated[1]}: {self._repeated[2]}")
                    return
                if view.phase == names.Phase.PAUSED:
                    stopped_since = self._now() if stopped_since is None else stopped_since
                    if self._now() - stopped_since >= STOP_AFTER:
                        self._stop(view)
                        return
                else:
                    stopped_since = None
                await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))
        if scope.cancelled_caught:
            self.rec.stops.append(("", "NotFinishedInRehearsal",
                                   f"the twin did not finish within {self.budget:g} s of rehearsal (stage "
                                   f"{self._stage or 'none'}); what it did so far is above"))
            self._add("stop", detail="rehearsal budget spent")

    async def _settle(self, reconciler: ClusterReconciler) -> None:
        """The machine reconciler reports every twin machine first (Ready, and the reboot or restart it waits
        for), as the live daemon has: an operation plans from those reports."""
        store = self.twin.management.store
        rt = store.resolve(names.GROUP, names.VERSION, names.PLURALS[names.TALOS_MACHINE])
        with anyio.move_on_after(SETTLE_BUDGET):
            while True:
                outcome = await reconciler.step({})
                machines = store.list(rt, self.twin.namespace)[0]
                if all(find((m.get("status") or {}).get("conditions"), names.READY) for m in machines):
                    return
                await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))

    def _stop(self, view: OperationView) -> None:
        cond = view.condition() or {}
        stop = (view.condition_type, str(cond.get("reason") or ""), str(cond.get("message") or ""))
        self.rec.stops.append(stop)
        self._add("stop", detail=f"{stop[1]}: {stop[2]}")

    def _hand_off(self, op: Obj, view: OperationView) -> None:
        """The person a description names (``person_stage``: e.g. AwaitingCredentials) acts; in the twin only."""
        desc = view.description
        stage = desc.awaits_credentials if desc is not None else None
        if stage is None or view.stage != stage or stage in self._acted:
            return
        status = op.get("status") or {}
        section = status.get("caRotation") or {}
        token = handoff_token(section.get("certificates") or [])
        if not token:
            return
        self._acted.add(stage)
        self._add("act", detail=f"hand-off in {stage}: a person runs `ichord cluster credentials "
                                f"{self.twin.cluster_name} -n {self.twin.namespace} --acknowledge`")
        store = self.twin.management.store
        rt = store.resolve(names.GROUP, names.VERSION, names.PLURALS[names.TALOS_OPERATION])
        fresh = store.get(rt, self.twin.namespace, self.name)
        fresh["metadata"].setdefault("annotations", {})[names.CREDENTIALS_HANDOFF_ANNOTATION] = token
        store.update(rt, self.twin.namespace, self.name, fresh)
