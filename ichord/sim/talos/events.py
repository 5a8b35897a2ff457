"""A simulated node's machine events (machined's event stream, MachineService.Events).

machined keeps the events of the current boot in a buffer; the Events RPC replays its tail
(``tail_events``: -1 all, 0 none, N the last N; or those after ``tail_id``, or of the last
``tail_seconds``) and then follows. Each event wraps its payload in an Any whose type URL is
``talos/runtime/<proto name>``, which machinery's client decodes. A reboot ends the buffer with
the node: the next boot starts a new one.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from google.protobuf import any_pb2
from google.protobuf.message import Message

from ichord.talos.proto.gen.machine import machine_pb2 as m

TYPE_URL_PREFIX = "talos/runtime/"
CAPACITY = 1000
_ids = itertools.count(1)


class EventLog:
    def __init__(self) -> None:
        self._events: list[tuple[float, m.Event]] = []
        self._watchers: list[asyncio.Queue[m.Event | None]] = []

    def reset(self) -> None:
        """A new boot: the buffer starts empty."""
        self._events = []

    def down(self) -> None:
        """The node went away: every follower's stream ends (None)."""
        for queue in list(self._watchers):
            queue.put_nowait(None)

    def emit(self, payload: Message, actor_id: str = "") -> None:
        data = any_pb2.Any(type_url=TYPE_URL_PREFIX + payload.DESCRIPTOR.full_name,
                           value=payload.SerializeToString())
        # machined's IDs are xids: sortable by time; a counter in hex keeps that order.
        event = m.Event(data=data, id=f"{time.time_ns():x}{next(_ids):08x}", actor_id=actor_id)
        self._events = [*self._events[-(CAPACITY - 1):], (time.monotonic(), event)]
        for queue in list(self._watchers):
            queue.put_nowait(event)

    def machine_status(self, stage: str, ready: bool, unmet: list[tuple[str, str]] | None = None) -> None:
        status = m.MachineStatusEvent.MachineStatus(ready=ready, unmet_conditions=[
            m.MachineStatusEvent.MachineStatus.UnmetCondition(name=n, reason=r) for n, r in unmet or []])
        self.emit(m.MachineStatusEvent(stage=m.MachineStatusEvent.MachineStage.Value(stage), status=status))

    def sequence(self, name: str, action: str, actor_id: str) -> None:
        self.emit(m.SequenceEvent(sequence=name, action=m.SequenceEvent.Action.Value(action)), actor_id)

    def backlog(self, tail_events: int, tail_id: str, tail_seconds: int) -> list[m.Event]:
        if tail_id:
            ids = [e.id for _, e in self._events]
            return [e for _, e in self._events[ids.index(tail_id) + 1:]] if tail_id in ids else []
        if tail_seconds > 0:
            since = time.monotonic() - tail_seconds
            return [e for at, e in self._events if at >= since]
        if tail_events < 0:
            return [e for _, e in self._events]
        return [e for _, e in self._events[len(self._events) - tail_events:]] if tail_events else []

    def subscribe(self) -> asyncio.Queue[m.Event | None]:
        queue: asyncio.Queue[m.Event | None] = asyncio.Queue()
        self._watchers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[m.Event | None]) -> None:
        if queue in self._watchers:
            self._watchers.remove(queue)
