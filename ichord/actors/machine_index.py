"""The objects of each cluster (TalosMachines, TalosOperations), kept up to date from an informer's events.

A cluster step used to scan and sort every TalosMachine of the fleet to find its own: at 1,000 clusters
that was 4,000 objects per step, a cost that grew with the square of the fleet while it converged. The
index is only a shortlist: the step still reads each object from the informer's cache and checks its
clusterRef, so a stale entry can never hand a cluster a machine that is not its own.
"""

from __future__ import annotations

from ichord.api.views import cluster_ref
from ichord.watchers.informer import Informer, Obj, WatchEvent

Key = tuple[str, str]  # (namespace, name)


class ByCluster:
    def __init__(self, informer: Informer) -> None:
        self._informer = informer
        self._groups: dict[tuple[str, str | None], set[Key]] = {}
        self._group_of: dict[Key, tuple[str, str | None]] = {}
        for key, obj in list(informer.cache.items()):
            self._place(key, obj)
        informer.add_handler(self.on_event)  # before the router's handler (registered later) wakes any actor

    def on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            self._remove(event.key)
        else:
            self._place(event.key, event.obj)

    def keys(self, namespace: str, cluster: str) -> set[Key]:
        """The shortlist of the cluster's objects (check each one's clusterRef: the cache is the truth)."""
        return set(self._groups.get((namespace, cluster), ()))

    def objects(self, namespace: str, cluster: str) -> list[tuple[Key, Obj]]:
        """The cluster's objects as the informer holds them now, by name."""
        out = []
        for key in sorted(self._groups.get((namespace, cluster), ())):
            obj = self._informer.cache.get(key)
            if obj is not None and cluster_ref(obj) == cluster:
                out.append((key, obj))
        return out

    def __len__(self) -> int:
        return len(self._group_of)

    def _place(self, key: Key, obj: Obj) -> None:
        group = (key[0], cluster_ref(obj))
        if self._group_of.get(key) == group:
            return
        self._remove(key)
        self._group_of[key] = group
        self._groups.setdefault(group, set()).add(key)

    def _remove(self, key: Key) -> None:
        group = self._group_of.pop(key, None)
        if group is None:
            return
        members = self._groups.get(group)
        if members is not None:
            members.discard(key)
            if not members:
                del self._groups[group]
