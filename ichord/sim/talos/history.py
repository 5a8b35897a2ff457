"""The simulation's history: everything that happened, as plain JSON-ready data, in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Called with each event as it is recorded (same task, synchronously): the combined environment
#: follows node state from here.
Listener = Callable[[dict[str, Any]], None]


class History:
    """Append-only list of events ``{"seq", "at", "kind", "node", ...}``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.listeners: list[Listener] = []
        self._start = time.monotonic()

    def record(self, kind: str, node: str | None = None, **data: Any) -> dict[str, Any]:
        event = {"seq": len(self.events) + 1, "at": round(time.monotonic() - self._start, 6),
                 "wall": time.time(), "kind": kind, "node": node, **data}
        self.events.append(event)
        for listener in list(self.listeners):
            listener(event)
        return event

    def of(self, kind: str | None = None, node: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events
                if (kind is None or e["kind"] == kind) and (node is None or e["node"] == node)]

    def since(self, seq: int) -> list[dict[str, Any]]:
        return self.events[seq:]
