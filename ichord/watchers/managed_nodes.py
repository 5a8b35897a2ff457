"""A node's return as an event, not a poll: the managed cluster's Nodes watched while an operation waits on them.

A rollout that asked a node to reboot used to learn of its return only at its next poll (``reboot_poll``), on every
node of the plan. ``NodeWatch`` watches the managed cluster's Nodes (one Informer on the admin client the operation
already holds, operations/managed/clients.py) and wakes the cluster's actor the moment a Node turns Ready or reports
a new ``status.nodeInfo.bootID``: the kubelet's own account of the new boot, on real Kubernetes as on the simulator.

The watch only wakes; it decides nothing. The step it wakes reads the boot ID from Talos and the Node with a live
GET, as the poll's step did (kube/nodes.py: a cache must not decide a reboot), and the poll stays as the fallback
for a watch that is down (the managed API restarting, a control plane rebooting behind a single endpoint).
The operations layer holds the watch only as ``operations.managed.clients.NodeWatcher``: the actor composes it
(ClusterScope.watch_nodes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from ichord.kube.client import KubeClient
from ichord.kube.reads import node_ready
from ichord.settings import Timing
from ichord.watchers.informer import Informer, Resource, WatchEvent

log = structlog.get_logger(__name__)

#: Tells the cluster's actor that ``obj`` changed (``reason``): the step runs now rather than at its poll.
Wake = Callable[[tuple[str, str], str], None]
NODE = "Node"
NODES = Resource("", "v1", "nodes")


def _boot_id(obj: dict[str, Any]) -> str:
    return str(((obj.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


def returned(event: WatchEvent) -> bool:
    """The Node came back: Ready now and not before, or on a boot it did not report before."""
    old = event.old
    if event.type == "DELETED" or old is None:  # gone, or first seen (the informer's first LIST): nothing came back
        return False
    return (node_ready(event.obj) and not node_ready(old)) or _boot_id(event.obj) != _boot_id(old)


class NodeWatch:
    """One cluster's Node informer and the task that runs it (it outlives a step: ``close`` ends it)."""

    def __init__(self, client: KubeClient, wake: Wake, timing: Timing) -> None:
        self.wake = wake
        self.informer = Informer(client, NODES, timing=timing, handlers=[self._on_node])
        # A task of its own, not of a task group: it lives across the operation's steps, from the step that first
        # waits on a node to the close of the client it reads through (ManagedClients), which cancels it.
        self._task = asyncio.get_running_loop().create_task(self.informer.run(), name="managed node watch")

    def _on_node(self, event: WatchEvent) -> None:
        if returned(event):
            self.wake((NODE, event.key[1]), "NodeReturned")

    async def close(self) -> None:
        self._task.cancel()
        # Bounded: a cancel that races a watch line can be lost on Python 3.11 (gh-86296).
        _, stuck = await asyncio.wait([self._task], timeout=5.0)
        if stuck:
            log.warning("managed node watch ignored its cancel")
