"""core/v1 Events posted the way client-go's EventCorrelator does.

- aggregation: more than ``aggregate_max`` - 1 distinct messages for the same (object, type,
  reason) within ``aggregate_window`` collapse into one "(combined from similar events): ..." Event;
- dedup: an Event identical to an earlier one bumps that Event's ``count`` by PATCH;
- spam filter: a token bucket per involved object (burst 25, one token per 5 minutes).
Messages pass through ``scrub`` first; a failed post is logged and never raised. ``record`` never
blocks the caller: events queue for ``run``, the task that posts them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound
from ichord.pki.scrub import scrub_text

log = structlog.get_logger(__name__)

NORMAL, WARNING = "Normal", "Warning"
MAX_MESSAGE = 1024
COMBINED_PREFIX = "(combined from similar events): "


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = ""

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", "")),
                   str(meta.get("uid", "")), str(obj.get("apiVersion", "")))

    def involved(self) -> dict[str, str]:
        ref = {"kind": self.kind, "namespace": self.namespace, "name": self.name}
        if self.uid:
            ref["uid"] = self.uid
        if self.api_version:
            ref["apiVersion"] = self.api_version
        return ref


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class _Posted:
    name: str
    namespace: str
    count: int
    first: str


@dataclass
class _Aggregate:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


class EventRecorder:
    def __init__(self, client: KubeClient, *, component: str = "ichord", instance: str | None = None,
                 scrub: Callable[[str], str] = scrub_text, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC), burst: int = 25,
                 refill_seconds: float = 300.0, aggregate_max: int = 10, aggregate_window: float = 600.0,
                 queue_size: int = 1000, cache_size: int = 4096) -> None:
        self.client = client
        self.component = component
        self.instance = instance or socket.gethostname()
        self.scrub = scrub
        self._monotonic, self._wall = monotonic, wall
        self.burst, self.refill_seconds = burst, refill_seconds
        self.aggregate_max, self.aggregate_window = aggregate_max, aggregate_window
        self._queue: asyncio.Queue[tuple[ObjectRef, str, str, str]] = asyncio.Queue(queue_size)
        self._buckets: dict[tuple[str, ...], _Bucket] = {}
        self._aggregates: OrderedDict[tuple[str, ...], _Aggregate] = OrderedDict()
        self._posted: OrderedDict[tuple[str, ...], _Posted] = OrderedDict()
        self._cache_size = cache_size
        self.dropped = 0

    # -- the non-blocking front --------------------------------------------------------------
    def record(self, obj: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Queue an Event; never blocks, never raises for a full queue (the Event is dropped and counted)."""
        try:
            self._queue.put_nowait((obj, type_, reason, message))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event dropped: queue full", reason=reason, object=f"{obj.namespace}/{obj.name}")

    async def run(self) -> None:
        while True:
            obj, type_, reason, message = await self._queue.get()
            await self.post(obj, type_, reason, message)

    async def drain(self) -> None:
        """Post everything queued so far (for shutdown and tests)."""
        while not self._queue.empty():
            await self.post(*self._queue.get_nowait())

    # -- the correlator ----------------------------------------------------------------------
    async def post(self, obj: ObjectRef, type_: str, reason: str, message: str) -> bool:
        """Correlate and write one Event; False when filtered or when the API refused it (logged)."""
        if type_ not in (NORMAL, WARNING):
            raise ValueError(f"event type must be {NORMAL} or {WARNING}, not {type_!r}")
        if obj.kind == "Event":
            return False  # never events about Events
        message = self.scrub(message)[:MAX_MESSAGE]
        source = (self.component, self.instance, obj.kind, obj.namespace, obj.name, obj.uid, obj.api_version)
        message, key = self._aggregate(source, type_, reason, message)
        if not self._allow(source):
            log.debug("event rate-limited", reason=reason, object=f"{obj.namespace}/{obj.name}")
            return False
        try:
            await self._write(obj, type_, reason, message, key)
        except KubeError as exc:
            log.warning("event not posted", reason=reason, object=f"{obj.namespace}/{obj.name}", error=str(exc))
            return False
        return True

    def _aggregate(self, source: tuple[str, ...], type_: str, reason: str,
                   message: str) -> tuple[str, tuple[str, ...]]:
        agg_key = (*source, type_, reason)
        now = self._monotonic()
        entry = self._aggregates.get(agg_key)
        if entry is None or now - entry.last > self.aggregate_window:
            entry = _Aggregate()
        entry.messages.add(message)
        entry.last = now
        self._remember(self._aggregates, agg_key, entry)
        if len(entry.messages) < self.aggregate_max:
            return message, (*agg_key, message)
        return COMBINED_PREFIX + message, agg_key

    def _allow(self, source: tuple[str, ...]) -> bool:
        now = self._monotonic()
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = self._buckets[source] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) / self.refill_seconds)
        bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    async def _write(self, obj: ObjectRef, type_: str, reason: str, message: str, key: tuple[str, ...]) -> None:
        now = self._wall().astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # core/v1 Event times are seconds
        namespace = obj.namespace or "default"
        seen = self._posted.get(key)
        if seen is not None:
            try:
                await self.client.raw(
                    "PATCH", f"/api/v1/namespaces/{seen.namespace}/events/{seen.name}",
                    body={"count": seen.count + 1, "lastTimestamp": now, "message": message},
                    content_type="application/strategic-merge-patch+json")
                seen.count += 1
                self._posted.move_to_end(key)
                return
            except NotFound:
                self._posted.pop(key, None)  # expired by the server: start a new one
        name = f"{obj.name}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": obj.involved(), "reason": reason, "message": message, "type": type_,
            "source": {"component": self.component, "host": self.instance},
            "reportingComponent": self.component, "reportingInstance": self.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        await self.client.raw("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        self._remember(self._posted, key, _Posted(name, namespace, 1, now))

    def _remember(self, cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)
