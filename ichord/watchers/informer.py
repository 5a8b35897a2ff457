"""A list-then-watch informer that does not die silently (python-ecosystem-notes.md, "Watching").

List, then watch from the list's resourceVersion with bookmarks; keep the last resourceVersion
(bookmarks included); on 410 Gone re-list and turn the difference into events so none is lost;
reconnect when the stream is silent past the inactivity timeout; jitter the server-side timeout;
retry list and watch failures with capped exponential backoff. Handlers are plain callables that
must return at once (enqueue into a mailbox); one that raises is logged and the watch goes on.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import structlog

from ichord.kube.client import KubeClient
from ichord.kube.errors import Gone, KubeError, from_exception, from_status
from ichord.metrics import WATCH_RESTARTS
from ichord.settings import Timing

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
#: A handler running longer than this holds up every other event of the kind (seconds).
SLOW_HANDLER = 0.05


@dataclass(frozen=True)
class Resource:
    """What to watch: a resource of a group/version, in one namespace or all (None)."""

    group: str
    version: str
    plural: str
    namespace: str | None = None

    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespace:
            return f"{base}/namespaces/{self.namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    @property
    def label(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    old: Obj | None = None

    @property
    def key(self) -> tuple[str, str]:
        return _key(self.obj)


Handler = Callable[[WatchEvent], None]


class _Restart(Exception):  # control flow, not an error
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Informer:
    def __init__(self, client: KubeClient, resource: Resource, *, timing: Timing | None = None,
                 label_selector: str | None = None, handlers: Iterable[Handler] = (),
                 rng: random.Random | None = None, transform: Callable[[Obj], Obj] | None = None) -> None:
        """``transform`` shapes every object before it is cached or handed on (client-go's SetTransform): the
        bundle Secrets' informer keeps metadata only, so no key material sits in its cache."""
        self.client = client
        self.resource = resource
        self.timing = timing or Timing.from_env()
        self.label_selector = label_selector
        self.handlers: list[Handler] = list(handlers)
        self.cache: dict[tuple[str, str], Obj] = {}
        self.resource_version = ""
        self.synced = anyio.Event()
        self.restarts: Counter[str] = Counter()
        self._rng = rng or random.Random()  # noqa: S311  (jitter, not security)
        self._transform = transform
        self._relists: list[anyio.Event] = []  # relist() callers waiting for the next LIST
        self._interrupt: anyio.CancelScope | None = None  # the current pass of the loop (watch, backoff or list)

    # -- public surface ----------------------------------------------------------------------
    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def get(self, namespace: str, name: str) -> Obj | None:
        obj = self.cache.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self) -> list[Obj]:
        return [copy.deepcopy(o) for _k, o in sorted(self.cache.items())]

    async def wait_synced(self) -> None:
        await self.synced.wait()

    async def relist(self) -> None:
        """A fresh LIST now, the watch resumed from it; returns once the cache is that list (or newer).

        What a new leader does before it acts: its watch may lag behind writes of the leader before it (a watch
        in backoff, a slow stream), and those writes may be markers of irreversible calls. One request."""
        done = anyio.Event()
        self._relists.append(done)
        if self._interrupt is not None:
            self._interrupt.cancel()  # the watch (or its backoff) ends here; the loop lists next
        await done.wait()

    async def run(self) -> None:
        """Run until cancelled; never returns on its own and never lets a failure end the loop."""
        backoff = self.timing.watch_backoff_initial
        need_list = True
        while True:
            with anyio.CancelScope() as self._interrupt:
                try:
                    if need_list or self._relists:
                        asked, self._relists = self._relists, []
                        try:
                            await self._list()
                        except BaseException:
                            self._relists[:0] = asked  # not listed: they wait for the next one
                            raise
                        for done in asked:
                            done.set()
                        need_list = False
                        backoff = self.timing.watch_backoff_initial
                    await self._watch()
                    self._restart("closed")
                except _Restart as r:
                    self._restart(r.reason)
                    if r.reason == "expired":
                        need_list = True
                    backoff = self.timing.watch_backoff_initial
                except KubeError as exc:
                    self._restart("error")
                    if isinstance(exc, Gone):
                        need_list = True
                        continue
                    delay = backoff * (0.5 + self._rng.random())
                    log.warning("watch failed, retrying", resource=self.resource.label, error=str(exc),
                                retry_in=round(delay, 3), listing=need_list)
                    await anyio.sleep(delay)
                    backoff = min(backoff * 2, self.timing.watch_backoff_max)
            self._interrupt = None

    # -- internals ---------------------------------------------------------------------------
    def _restart(self, reason: str) -> None:
        self.restarts[reason] += 1
        WATCH_RESTARTS.labels(resource=self.resource.label, reason=reason).inc()

    def _query(self) -> list[tuple[str, str]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []

    async def _list(self) -> None:
        out = await self.client.raw("GET", self.resource.path(), query=self._query())
        fresh = {_key(o): self._shape(o) for o in out.get("items") or []}
        old = self.cache
        self.cache = fresh
        self.resource_version = str((out.get("metadata") or {}).get("resourceVersion", ""))
        # The re-list diff stands in for every event the lost watch history held.
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._dispatch(WatchEvent("ADDED", obj))
            elif (before.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get(
                    "resourceVersion"):
                self._dispatch(WatchEvent("MODIFIED", obj, before))
        for key, obj in old.items():
            if key not in fresh:
                self._dispatch(WatchEvent("DELETED", obj))
        if not self.synced.is_set():
            log.info("informer synced", resource=self.resource.label, objects=len(fresh))
            self.synced.set()

    async def _watch(self) -> None:
        server_timeout = self.timing.watch_timeout * (1 + 0.5 * self._rng.random())
        query = [*self._query(), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("resourceVersion", self.resource_version), ("timeoutSeconds", str(max(1, round(server_timeout))))]
        connect = self.client.timeout
        limits = aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=None)
        resp: aiohttp.ClientResponse = await self.client.raw("GET", self.resource.path(), query=query,
                                                             limits=limits, stream=True)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(resp.content.readline(), self.timing.watch_inactivity_timeout)
                except TimeoutError:
                    raise _Restart("inactivity") from None
                except (aiohttp.ClientError, OSError) as exc:
                    raise from_exception(exc) from exc
                if not line:
                    return
                self._handle_line(line)
        finally:
            resp.close()

    def _handle_line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
        except (ValueError, KeyError, TypeError):
            log.warning("undecodable watch line", resource=self.resource.label)
            raise _Restart("error") from None
        if kind == "ERROR":
            err = from_status(int(obj.get("code") or 0), obj)
            if isinstance(err, Gone):
                raise _Restart("expired")
            raise err
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        obj = self._shape(obj)
        key = _key(obj)
        if kind == "DELETED":
            old = self.cache.pop(key, None)
            self._dispatch(WatchEvent("DELETED", obj, old))
        else:
            old = self.cache.get(key)
            self.cache[key] = obj
            self._dispatch(WatchEvent("ADDED" if old is None else "MODIFIED", obj, old))

    def _shape(self, obj: Obj) -> Obj:
        return self._transform(obj) if self._transform is not None else obj

    def _dispatch(self, event: WatchEvent) -> None:
        for handler in list(self.handlers):
            start = time.monotonic()
            try:
                handler(event)
            except Exception:  # a broken handler must not stop the watch for everyone else
                log.exception("informer handler failed", resource=self.resource.label, change=event.type,
                              object="/".join(event.key))
            spent = time.monotonic() - start
            if spent > SLOW_HANDLER:
                log.warning("informer handler is slow; handlers must only enqueue", resource=self.resource.label,
                            seconds=round(spent, 3))
