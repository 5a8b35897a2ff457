"""Every signal ichord gives on the management API while a test runs: each Event and each condition transition.

Read from the simulator's own store (every write, in order, as the API server took it), so nothing the daemon
wrote and overwrote between two polls is missed: an Event that was posted then aggregated, a Ready condition
that went False and back within a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ichord import yamlio
from ichord.api.views import OperationView
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.events import Change
from ichord.sim.kube.server import DEFAULT_CRD_DIR

_ICHORD_KINDS = frozenset({"TalosCluster", "TalosMachine", "TalosOperation"})


@dataclass(frozen=True)
class Posted:
    type: str
    reason: str
    kind: str
    name: str
    message: str


@dataclass(frozen=True)
class Transition:
    kind: str
    name: str
    condition: str
    status: str
    reason: str
    message: str


@dataclass
class Signals:
    """Listens from construction until ``close``; ``events`` and ``transitions`` in the order written."""

    env: SimEnvironment
    events: list[Posted] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    #: (operation, machine, state) each time an operation's status.machines entry changes state.
    machine_states: list[tuple[str, str, str]] = field(default_factory=list)
    #: Each TalosOperation write as `kubectl get talosoperations` shows it: (name, kind, STAGE, STEP, the stage
    #: the operation itself records), the columns read through the CRD's own jsonPaths.
    columns: list[tuple[str, str, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.env.management.store.listeners.append(self._on_change)

    def close(self) -> None:
        if self._on_change in self.env.management.store.listeners:
            self.env.management.store.listeners.remove(self._on_change)

    def _on_change(self, change: Change, rt: Any) -> None:
        if change.type == "DELETED":
            return
        if rt.plural == "events":
            self._on_event(change)
        elif rt.kind in _ICHORD_KINDS:
            self._on_object(change, rt.kind)

    def _on_event(self, change: Change) -> None:
        new, old = change.new, change.old or {}
        if old and new.get("count") == old.get("count") and new.get("message") == old.get("message"):
            return  # a write that is not a new occurrence
        involved = new.get("involvedObject") or {}
        self.events.append(Posted(str(new.get("type")), str(new.get("reason")), str(involved.get("kind")),
                                  str(involved.get("name")), str(new.get("message"))))

    def _on_object(self, change: Change, kind: str) -> None:
        before = {c.get("type"): c for c in ((change.old or {}).get("status") or {}).get("conditions") or []}
        name = str(change.new["metadata"]["name"])
        for cond in (change.new.get("status") or {}).get("conditions") or []:
            prior = before.get(cond.get("type"))
            key = ("status", "reason", "message")
            if prior is not None and all(prior.get(k) == cond.get(k) for k in key):
                continue
            self.transitions.append(Transition(kind, name, str(cond.get("type")), str(cond.get("status")),
                                               str(cond.get("reason")), str(cond.get("message"))))
        if kind == "TalosOperation":
            view = OperationView.of(change.new)
            row = (name, view.kind, _column(change.new, "Stage"), _column(change.new, "Step"), view.stage)
            if not self.columns or self.columns[-1] != row:
                self.columns.append(row)
        states = {e.get("name"): e.get("state") for e in ((change.old or {}).get("status") or {}).get("machines") or []
                  if isinstance(e, dict)}
        for entry in (change.new.get("status") or {}).get("machines") or []:
            if isinstance(entry, dict) and states.get(entry.get("name")) != entry.get("state"):
                self.machine_states.append((name, str(entry.get("name")), str(entry.get("state"))))

    def warnings(self) -> list[Posted]:
        return [e for e in self.events if e.type == "Warning"]

    def with_reason(self, reason: str) -> list[Transition]:
        return [t for t in self.transitions if t.reason == reason]


def _printer_columns() -> dict[str, str]:
    crd = yamlio.load((DEFAULT_CRD_DIR / "talosoperations.yaml").read_text())
    return {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}


_COLUMNS = _printer_columns()


def _column(obj: dict[str, Any], name: str) -> str:
    """A printer column's value for ``obj``: its simple ``.a.b.c`` jsonPath followed (what kubectl prints)."""
    value: Any = obj
    for part in _COLUMNS[name].strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)
