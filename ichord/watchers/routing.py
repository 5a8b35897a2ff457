"""Turn informer events into messages for the cluster actors.

Status-only updates are not routed: the actors write statuses themselves, and a write must not
wake the writer again (it would re-read every node in a loop). A change of spec (generation),
labels, annotations, finalizers or deletion is routed; so is any change of a TalosOperation's
status (a rotation's stage decides whether the machine reconciler stands aside).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ichord.watchers.informer import WatchEvent

Obj = dict[str, Any]
Tell = Callable[[str, str, tuple[str, str], str], None]  # (namespace, cluster, object key, reason)


def _meta_changed(old: Obj | None, new: Obj) -> bool:
    if old is None:
        return True
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if om.get("generation") != nm.get("generation"):
        return True
    return any(om.get(key) != nm.get(key) for key in ("labels", "annotations", "finalizers", "deletionTimestamp"))


def _cluster_ref(obj: Obj) -> str | None:
    name = ((obj.get("spec") or {}).get("clusterRef") or {}).get("name")
    return str(name) if name else None


class Router:
    def __init__(self, tell: Tell,
                 clusters_of_secret: Callable[[str, str], list[tuple[str, str]]] | None = None) -> None:
        self._tell = tell
        self._clusters_of_secret = clusters_of_secret
        self.active = False  # only the leader's actors take messages

    def on_cluster(self, ev: WatchEvent) -> None:
        if not self.active or (ev.type == "MODIFIED" and not _meta_changed(ev.old, ev.obj)):
            return
        ns, name = ev.key
        self._tell(ns, name, ("TalosCluster", name), ev.type)

    def on_machine(self, ev: WatchEvent) -> None:
        if not self.active or (ev.type == "MODIFIED" and not _meta_changed(ev.old, ev.obj)):
            return
        clusters = {_cluster_ref(ev.obj)}
        if ev.old is not None:
            clusters.add(_cluster_ref(ev.old))  # a machine moved between clusters wakes both
        ns, name = ev.key
        for cluster in clusters - {None}:
            assert cluster is not None
            self._tell(ns, cluster, ("TalosMachine", name), ev.type)

    def on_bundle_secret(self, ev: WatchEvent) -> None:
        """A labelled bundle Secret appeared, changed or went: wake every cluster whose secretsRef names it."""
        if not self.active or self._clusters_of_secret is None:
            return
        ns, name = ev.key
        for cluster_ns, cluster in self._clusters_of_secret(ns, name):
            self._tell(cluster_ns, cluster, ("Secret", name), ev.type)

    def on_operation(self, ev: WatchEvent) -> None:
        if not self.active:
            return
        if ev.type == "MODIFIED" and ev.old is not None and not _meta_changed(ev.old, ev.obj) and (
            (ev.old.get("status") or {}) == (ev.obj.get("status") or {})
        ):
            return
        cluster = _cluster_ref(ev.obj)
        if cluster is not None:
            ns, name = ev.key
            self._tell(ns, cluster, ("TalosOperation", name), ev.type)
