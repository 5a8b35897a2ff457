"""A mailbox that never blocks its senders and coalesces by key.

Watchers put (key, reason) pairs; a burst of a thousand updates to one object is one pending entry
holding the latest reason, so one noisy cluster cannot grow a queue or stall another's actor.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import anyio


class Mailbox:
    def __init__(self) -> None:
        self._pending: dict[Hashable, str] = {}
        self._event = anyio.Event()
        self._closed = False

    def put(self, key: Hashable, reason: str) -> None:
        """Never blocks, never raises while open: the latest reason per key is kept."""
        if self._closed:
            return
        self._pending.pop(key, None)  # re-insert so iteration order follows the latest message
        self._pending[key] = reason
        self._event.set()

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._closed = True
        self._event.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def drain(self) -> dict[Hashable, str]:
        """Take everything pending now, without waiting."""
        taken, self._pending = self._pending, {}
        if not self._closed:
            self._event = anyio.Event()
        return taken

    async def take(self, max_wait: float | None = None) -> dict[Hashable, str]:
        """Wait for at least one message (or ``max_wait`` seconds) and take everything pending."""
        if not self._pending and not self._closed:
            with anyio.move_on_after(math.inf if max_wait is None else max(0.0, max_wait)):
                await self._event.wait()
        taken, self._pending = self._pending, {}
        if not self._closed:
            self._event = anyio.Event()
            if self._pending:
                self._event.set()
        return taken
