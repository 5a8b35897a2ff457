"""Invariants over the Talos simulator's history about kube-apiserver restarts
(docs/decisions.md#ca-rotation-passes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def overlapping_restarts(events: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of control planes whose kube-apiservers were restarting (restart .. ready) at the same time."""
    restarting: set[str] = set()
    overlaps: list[tuple[str, str]] = []
    for e in events:
        if e["kind"] == "apiserver_restart":
            overlaps += [(other, e["node"]) for other in sorted(restarting)]
            restarting.add(e["node"])
        elif e["kind"] in ("apiserver_ready", "boot"):
            restarting.discard(e["node"])
    return overlaps
