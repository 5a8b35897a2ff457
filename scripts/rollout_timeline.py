"""Where a ``config`` rollout's time goes, read from the simulators (scripts/bench_config.py).

Every mark is taken where it happens, never from ichord's own account: the Talos nodes' history (the STAGED
apply, the Reboot request, down, up), the managed API server's Nodes (cordon, Ready, uncordon) and the
management API server's operation status (a worker taken into ``status.workerRolls``, a machine recorded done
in ``status.roll.done``). Each mark is the first time it is seen for the machine.

``critical_path`` walks back from the last machine done: a control plane (and the plan's last machine) waits
for the machine before it in the plan, a worker for the slot it took, which the latest machine done before
it was taken freed. Along that chain the wall time splits into segments that add up to it exactly:

    taking it        the previous machine done -> this one taken (the next step, its plan and lock reads)
    gates, cordon    taken -> cordoned (dry run, Node Ready, etcd whole for a control plane)
    drain            cordoned -> the STAGED apply (eviction rounds)
    stage, marker    the STAGED apply -> Reboot asked (the boot ID read, the marker written)
    reboot           Reboot asked -> the node answers on its new boot (mandated)
    Ready            answers -> Node Ready on the new boot (mandated: docs/decisions.md#config-rollout's settle)
    notice, verify   Ready -> uncordoned (the step that sees it back: boot ID, render, etcd whole)
    record done      uncordoned -> recorded done in the operation's status
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

#: The segments in the order a machine passes them: (name, the mark it starts at, the mark it ends at).
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("gates_cordon", "taken", "cordoned"),
    ("drain", "cordoned", "staged"),
    ("stage_marker", "staged", "reboot_asked"),
    ("reboot", "reboot_asked", "up"),
    ("ready", "up", "ready"),
    ("notice_verify", "ready", "uncordoned"),
    ("record_done", "uncordoned", "done"),
)
#: Segments the ADR mandates: the reboot itself and the node's return to Ready (and etcd, which the sim joins at boot).
MANDATED = frozenset({"reboot", "ready"})


@dataclass
class Timeline:
    """Marks per machine, in seconds since ``start`` (time.monotonic)."""

    start: float = field(default_factory=time.monotonic)
    marks: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    #: The operation's worker slots as last seen, and the machines recorded done.
    _slots: set[str] = field(default_factory=set)
    _done: set[str] = field(default_factory=set)
    _cordoned: dict[str, bool] = field(default_factory=dict)
    _ready: dict[str, bool] = field(default_factory=dict)
    #: Kubernetes Node name -> machine name.
    nodes: dict[str, str] = field(default_factory=dict)
    completed: float | None = None

    def _mark(self, machine: str, what: str) -> None:
        self.marks[machine].setdefault(what, time.monotonic() - self.start)

    # ---- listeners (called synchronously by the simulators) ------------------------------------

    def on_talos(self, event: dict[str, Any]) -> None:
        node, kind = event.get("node") or "", event["kind"]
        if kind == "apply" and event.get("mode") == "STAGED":
            self._mark(node, "staged")
        elif kind == "reboot_requested":
            self._mark(node, "reboot_asked")
        elif kind == "up" and "reboot_asked" in self.marks.get(node, {}):
            self._mark(node, "up")
            if self._ready.get(node):  # Ready flipped just before, in the simulator's own listener
                self._mark(node, "ready")

    def on_managed(self, change: Any, rt: Any) -> None:
        if rt.plural != "nodes" or change.type == "DELETED":
            return
        machine = self.nodes.get(change.new["metadata"]["name"])
        if machine is None:
            return
        cordoned = bool((change.new.get("spec") or {}).get("unschedulable"))
        was = self._cordoned.get(machine, False)
        self._cordoned[machine] = cordoned
        if cordoned and not was:
            self._mark(machine, "cordoned")
        elif was and not cordoned and "cordoned" in self.marks.get(machine, {}):
            self._mark(machine, "uncordoned")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (change.new.get("status") or {}).get("conditions") or [])
        # The simulator flips Ready in the same listener call that records "up" (before this one sees it).
        if ready and not self._ready.get(machine, True) and "reboot_asked" in self.marks.get(machine, {}):
            self._mark(machine, "ready")
        self._ready[machine] = ready

    def on_management(self, change: Any, rt: Any) -> None:
        if rt.plural == "talosoperations":
            self.on_operation(change.new, deleted=change.type == "DELETED")

    def on_operation(self, obj: dict[str, Any], *, deleted: bool = False) -> None:
        """The operation as the management API holds it (the simulator's store, or a real server's watch)."""
        if deleted:
            return
        status = obj.get("status") or {}
        slots = {k for k, v in (status.get("workerRolls") or {}).items() if v is not None}
        for m in slots - self._slots:
            self._mark(m, "taken")
        self._slots = slots
        for m in (status.get("roll") or {}).get("done") or []:
            if m not in self._done:
                self._done.add(m)
                self._mark(m, "done")
        if status.get("phase") == "Completed" and self.completed is None:
            self.completed = time.monotonic() - self.start

    # ---- figures ----------------------------------------------------------------------------------

    def _taken(self, machine: str) -> float | None:
        m = self.marks.get(machine, {})
        found = [m[k] for k in ("taken", "cordoned") if k in m]
        return min(found) if found else None

    def critical_path(self, plan: list[str], workers: set[str]) -> dict[str, Any]:
        """The chain that ended last, and its time by segment (seconds, adding up to the last done)."""
        done = {m: self.marks[m]["done"] for m in plan if "done" in self.marks.get(m, {})}
        if not done:
            return {}
        chain: list[str] = []
        current: str | None = max(done, key=lambda m: done[m])
        while current is not None:
            chain.append(current)
            taken = self._taken(current)
            if current in workers and current != plan[-1] and taken is not None:
                before = [m for m, t in done.items() if t <= taken and m != current]
                current = max(before, key=lambda m: done[m]) if before else None
            else:
                i = plan.index(current)
                current = plan[i - 1] if i > 0 else None
        chain.reverse()
        totals: dict[str, float] = defaultdict(float)
        previous_done = 0.0
        for m in chain:
            marks = self.marks[m]
            taken = self._taken(m)
            if taken is None:
                continue
            totals["taking_it"] += max(0.0, taken - previous_done)
            at = taken
            for name, _start, end in SEGMENTS:
                if end in marks:
                    totals[name] += max(0.0, marks[end] - at)
                    at = max(at, marks[end])
            previous_done = marks.get("done", at)
        if self.completed is not None:
            totals["completing"] = max(0.0, self.completed - previous_done)
        return {"machines": len(chain), "control_planes": sum(1 for m in chain if m not in workers),
                "segments_s": {k: round(v, 3) for k, v in totals.items()},
                "mandated_s": round(sum(v for k, v in totals.items() if k in MANDATED), 3),
                "overhead_s": round(sum(v for k, v in totals.items() if k not in MANDATED), 3)}

    def _span(self, machine: str, start: str, end: str) -> float | None:
        marks = self.marks.get(machine, {})
        begin = self._taken(machine) if start == "taken" else marks.get(start)
        finish = marks.get(end)
        # Ready and "up" are marked in one listener call of the simulator, in either order: never below 0.
        return None if begin is None or finish is None else max(0.0, finish - begin)

    def means(self, machines: list[str]) -> dict[str, float]:
        """Each segment's mean over ``machines`` (seconds), and taken -> done."""
        out: dict[str, float] = {}
        for name, start, end in (("taken_to_done", "taken", "done"), *SEGMENTS):
            spans = [s for m in machines if (s := self._span(m, start, end)) is not None]
            if spans:
                out[name] = round(sum(spans) / len(spans), 3)
        return out
