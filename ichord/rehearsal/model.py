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
from typing import TYPE_CHECKING

from ichord.errors import IchordError
from ichord.operations.progress import DEFAULTS  # the same model the ETA of a real run is computed from

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

    def source(self, kind: str) -> str:
        return "given" if kind in self.given else "default"


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
            lo, hi = durations.ranges[kind]
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
