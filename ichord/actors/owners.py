"""One owner per Talos node address, per hostname in a cluster and per bundle Secret (docs/decisions.md#one-owner),
from the informers' caches.

Two TalosMachines naming one node take turns applying their configurations to it (each resync undoes the other's);
two TalosMachines of one cluster with one spec.hostname make two nodes that register as one Kubernetes Node;
two TalosClusters naming one bundle Secret share CAs that a rotation of either replaces under the other. Whoever
came first keeps it: the oldest object by creationTimestamp, then namespace and name. That order is read from the
objects alone, so every process, restarted anywhere, decides the same; the others are refused until the holder is
gone. Each index groups the informer's cache by identity from its events (a step sends no LIST and scans no fleet);
when a group's members change, the actors of the others are woken, so a refused one takes over at its next step.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Hashable
from typing import Any

from ichord.api import names
from ichord.api.views import ClusterView, cluster_ref
from ichord.talos.client import split_endpoint
from ichord.watchers.informer import Informer, WatchEvent

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
#: Tells a cluster's actor (namespace, name) that ``obj`` changed (Runtime.wake's shape).
Wake = Callable[[str, str, tuple[str, str], str], None]
#: The reason an owner index wakes an actor with (a member of its group came or went).
OWNER_CHANGED = "OwnerChanged"

_NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)


def node_address(address: str) -> str | None:
    """The node a Talos API address reaches, as one spelling: ``host:port`` with the default port made explicit, an
    IP in its compressed form (``fd00:0::1`` is ``fd00::1``; ``::ffff:10.0.0.1`` is ``10.0.0.1``), a name in lower
    case without its root dot. None for no address."""
    text = address.strip().lower()
    if not text:
        return None
    try:
        host, port = split_endpoint(text)
    except ValueError:  # a port that is no number: the machine is unreachable anyway; compared as written
        return text
    host = host.rstrip(".")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{host}:{port}"
    mapped = getattr(ip, "ipv4_mapped", None)
    return f"{(mapped or ip).compressed}:{port}"


def _created(obj: Obj) -> dt.datetime:
    stamp = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return dt.datetime.fromisoformat(stamp)
    except ValueError:
        return _NEVER  # not created through an API server: never before one that was


def _age(key: Key, obj: Obj) -> tuple[dt.datetime, str, str]:
    return (_created(obj), key[0], key[1])


class Owners:
    """The objects of an informer grouped by ``identity``; the first of a group holds it."""

    def __init__(self, informer: Informer, identity: Callable[[Obj], Hashable | None],
                 wake: Callable[[Key, Obj], None]) -> None:
        self._informer = informer
        self._identity = identity
        self._wake = wake
        self._members: dict[Hashable, set[Key]] = {}
        self._identity_of: dict[Key, Hashable] = {}
        for key, obj in list(informer.cache.items()):
            self._place(key, self._identity(obj))
        informer.add_handler(self.on_event)  # before the router's: the mover's own step sees its group as it is

    def on_event(self, event: WatchEvent) -> None:
        key = event.key
        before = self._identity_of.get(key)
        after = None if event.type == "DELETED" else self._identity(event.obj)
        if before == after:
            return
        self._remove(key)
        self._place(key, after)
        for identity in (before, after):  # the holder of either group may have changed: its others look again
            for other in sorted(self._members.get(identity, ()) if identity is not None else ()):
                obj = self._informer.cache.get(other)
                if other != key and obj is not None:
                    self._wake(other, obj)

    def members(self, identity: Hashable) -> list[Key]:
        """The objects of one identity, by key."""
        return sorted(self._members.get(identity, ()))

    def holder(self, key: Key, obj: Obj, *, may_hold: Callable[[Obj], bool] = lambda _obj: True) -> Key | None:
        """Who holds ``obj``'s identity when it is not ``obj`` itself: the oldest of its group that ``may_hold``
        (``obj`` as given counts even before the informer has it). None when ``obj`` holds it, or has none."""
        identity = self._identity(obj)
        if identity is None:
            return None
        first = (_age(key, obj), key)
        for other in self._members.get(identity, ()):
            cached = self._informer.cache.get(other)
            if other == key or cached is None or self._identity(cached) != identity or not may_hold(cached):
                continue
            first = min(first, (_age(other, cached), other))
        return None if first[1] == key else first[1]

    def _place(self, key: Key, identity: Hashable | None) -> None:
        if identity is None:
            return
        self._identity_of[key] = identity
        self._members.setdefault(identity, set()).add(key)

    def _remove(self, key: Key) -> None:
        identity = self._identity_of.pop(key, None)
        if identity is None:
            return
        members = self._members[identity]
        members.discard(key)
        if not members:
            del self._members[identity]


def machine_address(obj: Obj) -> str | None:
    """A TalosMachine's identity: the node its address reaches (every machine holds it, approved or not)."""
    return node_address(str(((obj.get("spec") or {}).get("address")) or ""))


def machine_hostname(obj: Obj) -> tuple[str, str, str] | None:
    """A TalosMachine's identity by name: its cluster and ``spec.hostname`` (its Kubernetes Node's name, one per
    cluster), in lower case without a root dot. None for a machine that lets the node name itself."""
    hostname = str(((obj.get("spec") or {}).get("hostname")) or "").strip().lower().rstrip(".")
    cluster = cluster_ref(obj)
    if not hostname or not cluster:
        return None
    return (str((obj.get("metadata") or {}).get("namespace") or ""), cluster, hostname)


def cluster_bundle(obj: Obj) -> tuple[str, str] | None:
    """A TalosCluster's identity here: the bundle Secret its secretsRef names (namespace, name)."""
    view = ClusterView.of(obj)
    return (view.secret_namespace, view.secret_name) if view.secret_name else None


def _woken_machine_cluster(wake: Callable[[], Wake]) -> Callable[[Key, Obj], None]:
    def told(key: Key, obj: Obj) -> None:
        cluster = cluster_ref(obj)
        if cluster:
            wake()(key[0], cluster, (names.TALOS_MACHINE, key[1]), OWNER_CHANGED)

    return told


def machine_owners(informer: Informer, wake: Callable[[], Wake]) -> Owners:
    """TalosMachines by node address; a change wakes the clusters of the others at that address."""
    return Owners(informer, machine_address, _woken_machine_cluster(wake))


def hostname_owners(informer: Informer, wake: Callable[[], Wake]) -> Owners:
    """TalosMachines by cluster and hostname; a change wakes the cluster (the others with that name are its own)."""
    return Owners(informer, machine_hostname, _woken_machine_cluster(wake))


def bundle_owners(informer: Informer, wake: Callable[[], Wake]) -> Owners:
    """TalosClusters by bundle Secret; a change wakes the other clusters naming it."""
    return Owners(informer, cluster_bundle,
                  lambda key, _obj: wake()(key[0], key[1], (names.TALOS_CLUSTER, key[1]), OWNER_CHANGED))
