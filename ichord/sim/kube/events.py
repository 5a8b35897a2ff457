"""The watch side of the store: the retained event window, watchers and their queues."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ichord.jsoncopy import copy_json
from ichord.sim.kube.status import gone

JSON = dict[str, Any]


@dataclass(frozen=True)
class Change:
    """One stored mutation: ``old`` is None for ADDED, ``new`` is the final state for DELETED."""

    rv: int
    key: tuple[str, str]
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    new: JSON
    old: JSON | None


@dataclass(eq=False)
class Watcher:
    key: tuple[str, str]
    namespace: str | None
    predicate: Callable[[JSON], bool]
    queue: asyncio.Queue[tuple[str, JSON]] = field(default_factory=asyncio.Queue)
    #: A stalled watch stays open and silent (the "dead watch behind a load balancer" fault).
    stalled: bool = False
    #: Set to make the server end the stream abruptly.
    dropped: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, change: Change) -> None:
        if self.stalled or change.key != self.key:
            return
        if self.namespace is not None and change.namespace != self.namespace:
            return
        now_match = self.predicate(change.new)
        if change.type == "ADDED":
            if now_match:
                self.queue.put_nowait(("ADDED", copy_json(change.new)))
            return
        if change.type == "DELETED":
            if now_match:
                self.queue.put_nowait(("DELETED", copy_json(change.new)))
            return
        was_match = change.old is not None and self.predicate(change.old)
        # A selector watch sees an object entering or leaving the selection as ADDED/DELETED.
        if now_match and was_match:
            self.queue.put_nowait(("MODIFIED", copy_json(change.new)))
        elif now_match:
            self.queue.put_nowait(("ADDED", copy_json(change.new)))
        elif was_match:
            self.queue.put_nowait(("DELETED", copy_json(change.new)))


class EventLog:
    """A bounded window of recent changes; watches from before the window get 410 Gone."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._changes: deque[Change] = deque()
        self.compacted_rv = 0
        self.watchers: list[Watcher] = []

    def append(self, change: Change) -> None:
        self._changes.append(change)
        while len(self._changes) > self.window:
            self.compacted_rv = self._changes.popleft().rv
        for watcher in list(self.watchers):
            watcher.offer(change)

    def compact(self, upto_rv: int) -> None:
        """Forget every change up to ``upto_rv`` (what etcd compaction does)."""
        while self._changes and self._changes[0].rv <= upto_rv:
            self._changes.popleft()
        self.compacted_rv = max(self.compacted_rv, upto_rv)

    def subscribe(self, watcher: Watcher, since_rv: int) -> None:
        """Replay the retained changes after ``since_rv`` into the watcher, then follow new ones."""
        if since_rv < self.compacted_rv:
            raise gone(f"too old resource version: {since_rv} ({self.compacted_rv + 1})")
        for change in self._changes:
            if change.rv > since_rv:
                watcher.offer(change)
        self.watchers.append(watcher)

    def unsubscribe(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)
