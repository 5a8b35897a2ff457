"""One cluster's actor outside the daemon: its three informers synced, an Event recorder, and a
``ClusterReconciler`` the caller steps itself (no leader election, no router, no mailbox).

The rehearsal runs an operation on its twin this way (rehearsal/run.py), and the tests that step a cluster by
hand build their world on it, so the wiring a step depends on (informers synced before the first step, the
recorder drained and the kinds' resources closed after the last) is written once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.runtime import Runtime
from ichord.api import names
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.operations.etcd_snapshot import DirectorySnapshots, SnapshotPort
from ichord.operations.kinds import default_registry
from ichord.operations.registry import Registry
from ichord.operations.scope import Clock, utcnow
from ichord.settings import Timing
from ichord.watchers.informer import Informer, Resource

_KINDS = (names.TALOS_CLUSTER, names.TALOS_MACHINE, names.TALOS_OPERATION)


@asynccontextmanager
async def standalone_actor(kube: KubeClient, namespace: str, cluster: str, timing: Timing, *, instance: str,
                           registry: Registry | None = None, clock: Clock = utcnow,
                           resync: float = 3600.0,
                           etcd_snapshots: SnapshotPort | None = None) -> AsyncIterator[ClusterReconciler]:
    """The actor of ``namespace/cluster`` over ``kube``, its informers synced; ``instance`` names the Events'
    reporting instance; ``registry``: the operation kinds (ichord's own when None); ``etcd_snapshots``: where an
    operation's etcd snapshot goes (the daemon's directory when None)."""
    informers = {kind: Informer(kube, Resource(names.GROUP, names.VERSION, names.PLURALS[kind]), timing=timing)
                 for kind in _KINDS}
    recorder = EventRecorder(kube, instance=instance)
    rt = Runtime(kube, namespace, informers[names.TALOS_CLUSTER], informers[names.TALOS_MACHINE],
                 informers[names.TALOS_OPERATION], recorder, timing, resync=resync,
                 registry=registry if registry is not None else default_registry(), clock=clock,
                 etcd_snapshots=etcd_snapshots if etcd_snapshots is not None else DirectorySnapshots())
    async with anyio.create_task_group() as tg:
        for informer in informers.values():
            tg.start_soon(informer.run)
        tg.start_soon(recorder.run)
        for informer in informers.values():
            await informer.wait_synced()
        reconciler = ClusterReconciler(rt, namespace, cluster)
        try:
            yield reconciler
        finally:
            reconciler.close()
            await rt.registry.close()
            await recorder.drain()
            tg.cancel_scope.cancel()
