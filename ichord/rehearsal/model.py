"""The duration model: how long each kind of step takes on a real cluster, and the prediction from a recording.

The twin keeps the order of things (which node, which step, where it stops); how long each takes on the live
cluster is this model's. Without a history of the cluster's own operations every duration is a default, a range
(low, high), and the output says so; ``--duration KIND=SECONDS`` or ``KIND=LOW-HIGH`` replaces one.

The prediction follows the twin's own concurrency (``schedule``): a node's drain (its cordon to its uncordon) is
one job in a worker slot, and the drains the twin held together are rolled as many at a time by the model's
durations, each node taking the next free slot in the twin's order, as the rollout takes the next worker when one
finishes; everything else is one after the other. Each node's step also costs the daemon's own time around it
(``overhead``: its writes, health gates, Node Ready and polls), a kind of the model like the others.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ichord.api import names
from ichord.errors import IchordError
from ichord.operations.progress import DEFAULTS  # the same model the ETA of a real run is computed from

Obj = dict[str, Any]

#: The daemon's own time per node step, which no Talos or Kubernetes step of its own covers.
OVERHEAD = "overhead"
#: Every kind of the model: the step kinds a real run records (progress.py) and the daemon's overhead.
KINDS: dict[str, tuple[float, float, str]] = {
    **DEFAULTS,
    OVERHEAD: (1.0, 10.0, "the daemon's own time around a node's step: its writes, health gates, Node Ready, polls"),
}

#: The operation's condition reasons that are a wait by the clock, and the daemon's setting (``Timing``) that is its
#: length: the twin waits them compressed; the prediction takes the live daemon's own.
SETTLES = {names.CARotationReason.SETTLING_CLIENTS: "ca_client_settle_delay",
           names.CARotationReason.SETTLING_NODES: "ca_kubelet_settle_delay"}

#: How a settle is priced (``Durations.of``): this prefix and its reason.
SETTLE = "settle:"

if TYPE_CHECKING:
    from ichord.rehearsal.run import Event
    from ichord.settings import Timing

#: Recorded event kind -> the step kind whose duration it costs.
COSTS = {"apply": "apply", "reboot": "reboot", "apiserver_restart": "apiserver_restart", "cordon": "drain",
         "stage": "stage"}


class DurationError(IchordError):
    """A --duration is not KIND=SECONDS or KIND=LOW-HIGH of a known kind."""


@dataclass(frozen=True)
class Durations:
    ranges: dict[str, tuple[float, float]] = field(default_factory=lambda: {k: (v[0], v[1])
                                                                           for k, v in KINDS.items()})
    #: The kinds set by the user (the rest are defaults, said as such).
    given: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, items: Sequence[str]) -> Durations:
        ranges = {k: (v[0], v[1]) for k, v in KINDS.items()}
        given = set()
        for item in items:
            kind, sep, value = item.partition("=")
            kind = kind.strip()
            if not sep or kind not in KINDS:
                raise DurationError(f"--duration {item!r}: write KIND=SECONDS or KIND=LOW-HIGH, KIND one of "
                                    f"{', '.join(KINDS)}")
            low_s, _, high_s = value.partition("-")
            try:
                low = float(low_s)
                high = float(high_s) if high_s else low
            except ValueError:
                raise DurationError(f"--duration {item!r}: {value!r} is not SECONDS or LOW-HIGH") from None
            if not (math.isfinite(low) and math.isfinite(high)):  # float() takes nan and inf: no duration
                raise DurationError(f"--duration {item!r}: {value!r} is not a number of seconds")
            if low < 0 or high < low:
                raise DurationError(f"--duration {item!r}: need 0 <= LOW <= HIGH")
            ranges[kind] = (low, high)
            given.add(kind)
        return cls(ranges, frozenset(given))

    #: Kind -> how many steps of this cluster's past operations its range comes from (``with_history``).
    recorded: dict[str, int] = field(default_factory=dict)
    #: (node, kind) -> that node's own recorded range: a node's steps cost what they cost it before.
    per_node: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    #: A settle's reason (``SETTLES``) -> its seconds in the live daemon's settings (``with_settings``).
    waits: dict[str, float] = field(default_factory=dict)

    def with_settings(self, timing: Timing) -> Durations:
        """The daemon's own waits by the clock, as its settings (``Timing``) make them."""
        return replace(self, waits={reason: float(getattr(timing, attr)) for reason, attr in SETTLES.items()})

    def source(self, kind: str) -> str:
        if kind in self.given:
            return "given"
        return f"history of {self.recorded[kind]} step(s)" if kind in self.recorded else "default"

    def of(self, kind: str, node: str) -> tuple[float, float]:
        """The range of ``kind`` on ``node``: given, else the node's own history, else the cluster's, else the
        default."""
        if kind.startswith(SETTLE):
            wait = self.waits.get(kind[len(SETTLE):], 0.0)
            return wait, wait
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
        return Durations(ranges, self.given, recorded, per_node, self.waits)


@dataclass(frozen=True)
class Timed:
    """An event with the predicted real time (low, high) from the operation's start to it."""

    event: Event
    at: tuple[float, float]


def predict(events: Sequence[Event], durations: Durations) -> tuple[list[Timed], tuple[float, float]]:
    """Each event at its predicted time from the start (low, high), and the total: the schedule of the twin's
    steps (``schedule``) priced with the lows, then with the highs."""
    lows = schedule(events, lambda kind, node: durations.of(kind, node)[0])
    highs = schedule(events, lambda kind, node: durations.of(kind, node)[1])
    out = [Timed(e, (lo, hi)) for e, lo, hi in zip(events, lows, highs, strict=True)]
    return out, (max(lows, default=0.0), max(highs, default=0.0))


@dataclass
class _Job:
    """One node's drain in the twin: its cordon to its uncordon (events by index), and who was in it."""

    node: str
    first: int
    last: int
    members: list[int] = field(default_factory=list)


def _jobs(events: Sequence[Event]) -> list[_Job]:
    open_: dict[str, _Job] = {}
    jobs: list[_Job] = []
    for i, e in enumerate(events):
        if e.kind == "cordon" and e.node not in open_:
            open_[e.node] = _Job(e.node, i, len(events) - 1)
            jobs.append(open_[e.node])
        if e.node in open_:
            open_[e.node].members.append(i)
            if e.kind == "uncordon":
                open_.pop(e.node).last = i
    return jobs


def _groups(jobs: list[_Job]) -> list[list[_Job]]:
    """The jobs whose spans overlap, chained: those the twin had under way together."""
    groups: list[list[_Job]] = []
    reach = -1
    for job in jobs:  # in the order they started
        if groups and job.first <= reach:
            groups[-1].append(job)
            reach = max(reach, job.last)
        else:
            groups.append([job])
            reach = job.last
    return groups


def _width(group: list[_Job]) -> int:
    """The most jobs of ``group`` under way at once in the twin: the slots its rollout had."""
    edges = sorted([(j.first, 1) for j in group] + [(j.last, -1) for j in group], key=lambda x: (x[0], -x[1]))
    most = now = 0
    for _at, d in edges:
        now += d
        most = max(most, now)
    return most


def _priced(e: Event) -> str | None:
    """The kind of the model ``e`` costs, if any."""
    return SETTLE + e.detail if e.kind == "settle" else COSTS.get(e.kind)


def schedule(events: Sequence[Event], cost: Callable[[str, str], float]) -> list[float]:
    """Each event's time from the start, ``cost(kind, node)`` the seconds of a step: the twin's drains (cordon to
    uncordon) that overlapped roll in as many slots as the twin had under way at once, each node in the next slot
    to free up (in the twin's order), the rest one after the other. Each node's step (a drain, or a run of one
    node's steps outside any drain) costs the daemon's ``overhead`` once."""
    at = [0.0] * len(events)
    starts = {g[0].first: g for g in _groups(_jobs(events))}
    now = 0.0
    last_node = ""
    i = 0
    while i < len(events):
        group = starts.get(i)
        if group is not None:
            slots = [now] * _width(group)
            end = now
            inside = {k for j in group for k in j.members}
            for job in group:
                t = heapq.heappop(slots) + cost(OVERHEAD, job.node)
                for k in job.members:
                    kind = _priced(events[k])
                    t += cost(kind, job.node) if kind is not None else 0.0
                    at[k] = t
                heapq.heappush(slots, t)
                end = max(end, t)
            last = max(j.last for j in group)
            for k in range(i, last + 1):  # what else happened meanwhile: a stage's settling after them, others
                if k not in inside:
                    kind = _priced(events[k])
                    end += cost(kind, events[k].node) if kind is not None else 0.0
                    at[k] = end
            now, last_node, i = end, "", last + 1
            continue
        e = events[i]
        kind = _priced(e)
        if kind is not None:
            if e.node and e.node != last_node:
                now += cost(OVERHEAD, e.node)
            now += cost(kind, e.node)
            last_node = e.node
        at[i] = now
        i += 1
    return at


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
