"""What a rehearsal says: the timeline with predicted times, the total as a range, the stops, as text or data."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ichord.rehearsal.live import LiveCluster
from ichord.rehearsal.model import KINDS, SETTLES, Durations, Timed, clock, most_at_once
from ichord.rehearsal.run import Event, Recording

Obj = dict[str, Any]

#: How a timeline row names each event kind.
WORDS = {
    "stage": "stage", "apply": "configuration applied", "reboot": "reboot", "down": "node down",
    "boot": "node booted", "apiserver_restart": "kube-apiserver restart", "apiserver_ready": "kube-apiserver ready",
    "cordon": "drain (cordon)", "uncordon": "uncordon", "evict": "pod evicted", "blocked": "waits",
    "act": "a person acts", "pdb": "drain blocked by", "stop": "STOPS", "settle": "the daemon waits",
    "snapshot": "etcd snapshot (played)",
}
#: Rows a text timeline leaves out (they are in -o json): the simulator's own detail of a reboot.
QUIET = frozenset({"down", "boot", "apiserver_ready"})


@dataclass
class Report:
    live: LiveCluster
    operation: Obj
    durations: Durations
    recording: Recording = field(default_factory=Recording)
    timeline: list[Timed] = field(default_factory=list)
    total: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def refused(cls, live: LiveCluster, operation: Obj, durations: Durations, reason: str, message: str) -> Report:
        rec = Recording(events=[Event(0.0, "stop", detail=f"{reason}: {message}")], stops=[("", reason, message)])
        return cls(live, operation, durations, rec, [Timed(rec.events[0], (0.0, 0.0))])

    @property
    def completes(self) -> bool:
        return self.recording.completed and not self.recording.stops

    @property
    def exit_code(self) -> int:
        return 0 if self.completes else 1

    def counted(self, kind: str) -> Counter[str]:
        return Counter(e.node for e in self.recording.events if e.kind == kind)

    def disruptions(self) -> list[tuple[str, str]]:
        """(kind, node) of each reboot and kube-apiserver restart, in order: what a real run is compared with."""
        return [(e.kind, e.node) for e in self.recording.events if e.kind in ("reboot", "apiserver_restart")]

    def as_data(self) -> Obj:
        spec = self.operation.get("spec") or {}
        return {
            "cluster": f"{self.live.namespace}/{self.live.name}",
            "operation": {"name": self.operation["metadata"]["name"], "kind": spec.get("kind")},
            "result": "completes" if self.completes else "stops",
            "predictedDuration": {"low": self.total[0], "high": self.total[1]},
            "durations": {k: {"low": lo, "high": hi, "source": self.durations.source(k), "covers": KINDS[k][2]}
                          for k, (lo, hi) in self.durations.ranges.items()},
            "timeline": [{"at": {"low": t.at[0], "high": t.at[1]}, "event": t.event.kind, "node": t.event.node,
                          "detail": t.event.detail} for t in self.timeline],
            "waits": {r: self.durations.waits.get(r, 0.0) for r in sorted({e.detail for e in self.recording.events
                                                                            if e.kind == "settle"})},
            "mostNodesAtOnce": most_at_once(self.recording.events),
            "reboots": dict(self.counted("reboot")),
            "apiserverRestarts": dict(self.counted("apiserver_restart")),
            "drains": dict(self.counted("cordon")),
            "stops": [{"condition": c, "reason": r, "message": m} for c, r, m in self.recording.stops],
            "twin": {"nodes": {n.machine: {"role": n.role, "talosVersion": n.talos_version,
                                           "etcdMembers": list(n.etcd_members)} for n in self.live.nodes.values()},
                     "podsPerNode": dict(self.live.pods_per_node()),
                     "podDisruptionBudgets": len(self.live.managed.get("pdbs", [])),
                     "notes": list(self.live.notes)},
        }

    def text(self) -> str:
        spec = self.operation.get("spec") or {}
        lines = [f"Rehearsal of {spec.get('kind')} {self.operation['metadata']['name']} on a twin of TalosCluster "
                 f"{self.live.namespace}/{self.live.name} ({len(self.live.nodes)} nodes; nothing was written)"]
        lines += [f"note: {n}" for n in self.live.notes]
        rows = [("AT", "EVENT", "NODE", "DETAIL")]
        for t in self.timeline:
            if t.event.kind in QUIET:
                continue
            at = clock(t.at[0]) if t.at[0] == t.at[1] else f"{clock(t.at[0])}-{clock(t.at[1])}"
            rows.append((at, WORDS.get(t.event.kind, t.event.kind), t.event.node, t.event.detail))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines += ["  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]).rstrip()
                  for r in rows]
        reboots, restarts, drains = self.counted("reboot"), self.counted("apiserver_restart"), self.counted("cordon")
        lines.append(f"reboots: {sum(reboots.values())}, kube-apiserver restarts: {sum(restarts.values())}, "
                     f"drains: {sum(drains.values())}")
        low, high = self.total
        lines.append(f"predicted duration: {clock(low)}" if low == high else
                     f"predicted duration: {clock(low)} to {clock(high)}")
        said = ", ".join(f"{k} {clock(lo)}" + ("" if lo == hi else f"-{clock(hi)}") + f" ({self.durations.source(k)})"
                         for k, (lo, hi) in self.durations.ranges.items())
        lines.append(f"durations: {said}")
        waited = sorted({e.detail for e in self.recording.events if e.kind == "settle"})
        if waited:
            lines.append("the daemon's waits: " + ", ".join(
                f"{r} {clock(self.durations.waits.get(r, 0.0))} ({SETTLES[r]})" for r in waited if r in SETTLES))
        together = most_at_once(self.recording.events)
        if together > 1:
            lines.append(f"note: the twin drained up to {together} nodes at once (maxUnavailable); the prediction "
                         f"rolls them {together} at a time, each node taking the next free slot")
        if self.completes:
            lines.append("result: the operation completes")
        else:
            lines.append("result: the real run would stop:")
            lines += [f"  {r}: {m}" for _c, r, m in self.recording.stops]
        return "\n".join(lines) + "\n"
