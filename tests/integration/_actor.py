"""One cluster actor's step over the real informers, as the leader runs it (for tests that count what a step does)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from ichord.actors.cluster import ClusterReconciler, Runtime
from ichord.api import names
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder
from ichord.settings import Timing
from ichord.watchers.informer import Informer, Resource


@contextlib.asynccontextmanager
async def cluster_actor(kube: KubeClient, controller_namespace: str, namespace: str, name: str, timing: Timing,
                        **runtime: Any) -> AsyncIterator[ClusterReconciler]:
    """The actor of TalosCluster ``namespace/name`` over synced TalosCluster, TalosMachine and TalosOperation
    informers; ``runtime``: the Runtime's other options (e.g. allowed_secret_namespaces). Its Events are drained
    on exit."""
    informers = [Informer(kube, Resource(names.GROUP, names.VERSION, names.PLURALS[k]), timing=timing)
                 for k in (names.TALOS_CLUSTER, names.TALOS_MACHINE, names.TALOS_OPERATION)]
    recorder = EventRecorder(kube, instance="test")
    async with anyio.create_task_group() as tg:
        for inf in informers:
            tg.start_soon(inf.run)
        tg.start_soon(recorder.run)
        for inf in informers:
            await inf.wait_synced()
        reconciler = ClusterReconciler(Runtime(kube, controller_namespace, *informers, recorder, timing, **runtime),
                                       namespace, name)
        try:
            yield reconciler
        finally:
            reconciler.close()
            await recorder.drain()
            tg.cancel_scope.cancel()
