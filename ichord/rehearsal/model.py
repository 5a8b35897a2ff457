"""The duration model: how long each kind of step takes on a real cluster, and the prediction from a recording.

The twin keeps the order of things (which node, which step, where it stops); how long each takes on the live
cluster is this model's. Without a history of the cluster's own operations every duration is a default, a range
(low, high), and the output says so; ``--duration KIND=SECONDS`` or ``KIND=LOW-HIGH`` replaces one. Steps are
added one after the other: workers a pass changes together (maxUnavailable above 1) can make the real run shorter
than the range, never longer; ``most_at_once`` tells the output when the twin did so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ichord.errors import IchordError
from ichord.operations.progress import DEFAULTS  # the same model the ETA of a real run is computed from

Obj = dict[str, Any]

if TYPE_CHECKING:
    from ichord.rehearsal.run import Event

#: Recorded event kind -> the step kind whose duration it costs.
COSTS = {"apply": "apply", "reboot": "reboot", "apiserver_restart": "apiserver_restart", "cordon": "drain",
         "stage": "stage"}


class DurationError(IchordError):
    """A --duration is not KIND=SECONDS or KIND=LOW-HIGH of a known kind."""


@dataclass(frozen=True)
class Durations:
    ranges: dict[str, tuple[float, float]] = field(default_factory=lambda: {k: (v[0], v[1])
                                                                           for k, v in DEFAULTS.items()})
    #: The kinds set by the user (the rest are defaults, said as such).
    given: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, items: Sequence[str]) -> Durations:
        ranges = {k: (v[0], v[1]) for k, v in DEFAULTS.items()}
        given = set()
        for item in items:
            kind, sep, value = item.partition("=")
            kind = kind.strip()
            if not sep or kind not in DEFAULTS:
                raise DurationError(f"--duration {item!r}: write KIND=SECONDS or KIND=LOW-HIGH, KIND one of "
                                    f"{', '.join(DEFAULTS)}")
            low_s, _, high_s = value.partition("-")
            try:
                low = float(low_s)
                high = float(high_s) if high_s else low
            except ValueError:
                raise DurationError(f"--duration {item!r}: {value!r} is not SECONDS or LOW-HIGH") from None
            if low < 0 or high < low:
                raise DurationError(f"--duration {item!r}: need 0 <= LOW <= HIGH")
            ranges[kind] = (low, high)
            given.add(kind)
        return cls(ranges, frozenset(given))

    #: Kind -> how many steps of this cluster's past operations its range comes from (``with_history``).
    recorded: dict[str, int] = field(default_factory=dict)
    #: (node, kind) -> that node's own recorded range: a node's steps cost what they cost it before.
    per_node: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def source(self, kind: str) -> str:
        if kind in self.given:
            return "given"
        return f"history of {self.recorded[kind]} step(s)" if kind in self.recorded else "default"

    def of(self, kind: str, node: str) -> tuple[float, float]:
        """The range of ``kind`` on ``node``: given, else the node's own history, else the cluster's, else the
        default."""
        if kind not in self.given and (node, kind) in self.per_node:
            return self.per_node[(node, kind)]
        return self.ranges[kind]

    def with_history(self, operations: Iterable[Obj]) -> Durations:
        """The ranges of the kinds not given, from what past operations recorded (status.progress.observed,
        operations/progress.py): per kind the lowest to the highest seen, per node its own. An observed step names
        every kind it cost (``drain+apply+reboot``); its last kind is credited with the time less the others'
        current middles (a reboot's own time, say). A ca-rotation's ``stage`` step spans the reboots inside the
        stage: it is not credited to any kind."""
        seen: dict[str, list[float]] = {}
        by_node: dict[tuple[str, str], list[float]] = {}
        for op in operations:
            progress = (op.get("status") or {}).get("progress") or {}
            for o in progress.get("observed") or [] if isinstance(progress, dict) else []:
                parts = str((o or {}).get("step") or "").split("+") if isinstance(o, dict) else []
                seconds = o.get("seconds") if isinstance(o, dict) else None
                main = parts[-1] if parts else ""
                if main not in self.ranges or main == "stage" or not isinstance(seconds, int | float):
                    continue
                others = sum(sum(self.ranges[k]) / 2 for k in parts[:-1] if k in self.ranges)
                own = max(0.0, float(seconds) - others)
                seen.setdefault(main, []).append(own)
                if o.get("node"):
                    by_node.setdefault((str(o["node"]), main), []).append(own)
        ranges, recorded = dict(self.ranges), dict(self.recorded)
        for kind, times in seen.items():
            if kind not in self.given:
                ranges[kind], recorded[kind] = (min(times), max(times)), len(times)
        per_node = {key: (min(t), max(t)) for key, t in by_node.items()}
        return Durations(ranges, self.given, recorded, per_node)


@dataclass(frozen=True)
class Timed:
    """An event with the predicted real time (low, high) from the operation's start to it."""

    event: Event
    at: tuple[float, float]


def predict(events: Iterable[Event], durations: Durations) -> tuple[list[Timed], tuple[float, float]]:
    """Each event at the sum of the steps before it (and its own), and the total."""
    low = high = 0.0
    out = []
    for e in events:
        kind = COSTS.get(e.kind)
        if kind is not None:
            lo, hi = durations.of(kind, e.node)
            low, high = low + lo, high + hi
        out.append(Timed(e, (low, high)))
    return out, (low, high)


def most_at_once(events: Iterable[Event]) -> int:
    """The most nodes cordoned together in the twin (a drain's cordon to its uncordon)."""
    cordoned: set[str] = set()
    most = 0
    for e in events:
        if e.kind == "cordon":
            cordoned.add(e.node)
        elif e.kind == "uncordon":
            cordoned.discard(e.node)
        most = max(most, len(cordoned))
    return most


def clock(seconds: float) -> str:
    """``1h02m``, ``12m30s``, ``45s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
