"""An informer's cache read through this process's own writes (client-go's mutation cache, in our words).

A step that wrote an object (a stage, a marker written before an irreversible call) must see that write in its
next step, even when the watch has not delivered it yet: a copy older than ichord's own write would let the
machine reconciler revert a rotation's stage, or a roll repeat a reboot it already asked for. So every object of
the kind that a write through the process's client returned is kept here (``note``, fed by
``KubeClient.on_written``) until the informer has caught up with it, and ``get`` hands out the newer of the two.

Caught up: the informer's stream (events and bookmarks) has passed the written resourceVersion, or its cached copy
is at least as new, or the object was deleted. ResourceVersions are compared as integers, which they are on every
Kubernetes storage (etcd's revision) and which Kubernetes guarantees since 1.35 (docs/architecture.md#read-your-writes).
A resourceVersion that is not an integer is only compared for equality: the written copy is handed out until the
cache holds that very version, or the object is deleted.
"""

from __future__ import annotations

from ichord.jsoncopy import copy_json
from ichord.watchers.informer import Informer, Obj, WatchEvent

Key = tuple[str, str]  # (namespace, name)


def resource_version(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _number(rv: str) -> int | None:
    try:
        return int(rv)
    except ValueError:
        return None


def _key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _uid(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is later than ``b`` (False when they cannot be ordered)."""
    x, y = _number(a), _number(b)
    return x is not None and y is not None and x > y


class ReadYourWrites:
    def __init__(self, informer: Informer) -> None:
        self._informer = informer
        self._copies: dict[Key, Obj] = {}
        informer.add_handler(self._on_event)

    def __len__(self) -> int:
        return len(self._copies)

    def note(self, obj: Obj) -> None:
        """An object as a write of this process returned it."""
        rv = resource_version(obj)
        if not rv:
            return
        key = _key(obj)
        held = self._copies.get(key)
        if held is not None and _uid(held) == _uid(obj) and not newer(rv, resource_version(held)):
            return  # an older answer arriving late
        if not self._caught_up(rv, self._informer.cache.get(key)):
            self._copies[key] = copy_json(obj)

    def get(self, key: Key) -> Obj | None:
        """The newer of the informer's copy and this process's last write of it (None: neither has it)."""
        cached = self._informer.cache.get(key)
        written = self._copies.get(key)
        if written is None:
            return cached
        if self._caught_up(resource_version(written), cached):
            del self._copies[key]
            return cached
        return written

    def keys(self, namespace: str) -> list[Key]:
        """The keys of the written copies in ``namespace`` (objects the informer may not hold yet)."""
        return [k for k in self._copies if k[0] == namespace]

    def _caught_up(self, written: str, cached: Obj | None) -> bool:
        w, stream = _number(written), _number(self._informer.resource_version)
        if w is not None and stream is not None and w <= stream:
            return True  # every event up to the write was delivered: the cache holds it, or what came after
        if cached is None:
            return False
        rv = resource_version(cached)
        return rv == written or newer(rv, written)

    def _on_event(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            return
        held = self._copies.get(event.key)
        if held is not None and _uid(held) == _uid(event.obj):
            del self._copies[event.key]  # gone: no copy of ours outlives it
