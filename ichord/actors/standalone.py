"""One cluster's actor outside the daemon: its three informers synced, an Event recorder, and a
``ClusterReconciler`` the caller steps itself (no leader election, no router, no mailbox).

The rehearsal runs an operation on its twin this way (rehearsal/run.py), and the tests that step a cluster by
hand build their world on it, so the wiring a step depends on (informers synced before the first step, the
recorder drained and the kinds' resources closed after the last) is written once.

A plain async context manager class, not an async generator: its task group is entered in ``__aenter__`` and left
in ``__aexit__``, by the caller's task, and never held across a generator's ``yield`` (an async generator may be
finalized by another task, or leave its frame's scopes in another order than they were entered). Its background
tasks (the informers, the recorder) each run under a cancel scope of their own, cancelled on exit: the task
group's own scope, whose host is the caller's task, is never cancelled, so no cancellation is ever delivered to the
caller (a loaded test runner used to see the group's ``cancel()`` arrive in its own task as a CancelledError).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType

import anyio
import anyio.abc
from anyio.abc import TaskGroup

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


class StandaloneActor:
    """``async with StandaloneActor(...) as reconciler``: the actor of ``namespace/cluster`` over ``kube``, its
    informers synced; ``instance`` names the Events' reporting instance; ``registry``: the operation kinds (ichord's
    own when None); ``etcd_snapshots``: where an operation's etcd snapshot goes (the daemon's directory when None)."""

    def __init__(self, kube: KubeClient, namespace: str, cluster: str, timing: Timing, *, instance: str,
                 registry: Registry | None = None, clock: Clock = utcnow, resync: float = 3600.0,
                 etcd_snapshots: SnapshotPort | None = None) -> None:
        clusters, machines, operations = (
            Informer(kube, Resource(names.GROUP, names.VERSION, names.PLURALS[kind]), timing=timing) for kind in _KINDS)
        self._informers = (clusters, machines, operations)
        self._recorder = EventRecorder(kube, instance=instance)
        self._rt = Runtime(kube, namespace, clusters, machines, operations, self._recorder, timing, resync=resync,
                           registry=registry if registry is not None else default_registry(), clock=clock,
                           etcd_snapshots=etcd_snapshots if etcd_snapshots is not None else DirectorySnapshots())
        self._namespace, self._cluster = namespace, cluster
        self._tg: TaskGroup | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._reconciler: ClusterReconciler | None = None

    async def __aenter__(self) -> ClusterReconciler:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            for run in (*(informer.run for informer in self._informers), self._recorder.run):
                await tg.start(self._background, run)  # back once its cancel scope is there to cancel
            for informer in self._informers:
                await informer.wait_synced()
        except BaseException:
            await self._stop()
            raise
        self._reconciler = ClusterReconciler(self._rt, self._namespace, self._cluster)
        return self._reconciler

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        try:
            if self._reconciler is not None:
                self._reconciler.close()
            await self._rt.registry.close()
            await self._recorder.drain()
        finally:
            await self._stop()
        return None

    async def _background(self, run: Callable[[], Awaitable[None]], *,
                          task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            self._scopes.append(scope)
            task_status.started()
            await run()

    async def _stop(self) -> None:
        """Cancel the background tasks (each its own scope) and leave the task group, which waits for them. The
        group is left as if nothing was raised (the caller's exception goes on by itself): it never cancels its own
        scope, whose host is the caller's task."""
        tg, self._tg = self._tg, None
        if tg is None:
            return
        for scope in self._scopes:
            scope.cancel()
        await tg.__aexit__(None, None, None)


def standalone_actor(kube: KubeClient, namespace: str, cluster: str, timing: Timing, *, instance: str,
                     registry: Registry | None = None, clock: Clock = utcnow, resync: float = 3600.0,
                     etcd_snapshots: SnapshotPort | None = None) -> StandaloneActor:
    """``async with standalone_actor(...) as reconciler``: see ``StandaloneActor``."""
    return StandaloneActor(kube, namespace, cluster, timing, instance=instance, registry=registry, clock=clock,
                           resync=resync, etcd_snapshots=etcd_snapshots)
