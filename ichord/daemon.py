"""``ichord run``: the task tree of architecture.md.

    ichord run
     ├─ http server: /metrics /healthz /readyz              (every replica)
     ├─ event recorder                                       (every replica)
     ├─ informers: TalosCluster, TalosMachine, TalosOperation (every replica)
     └─ leader elector  ──when leading──> actor system
                                            ├─ ClusterActor(ns/name) x N
                                            └─ supervisor (restarts a crashed actor with backoff)

Losing leadership cancels the actor system and exits non-zero (LeadershipLost); SIGTERM cancels the
tree, and the leader Lease is released if this process still holds it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

import anyio
import anyio.abc
import structlog

from ichord.actors.actor import ClusterActor, StepFn, Supervisor
from ichord.actors.cluster import ClusterReconciler, Runtime, cluster_of
from ichord.api.names import GROUP, LEADER_LEASE, PLURALS, TALOS_CLUSTER, TALOS_MACHINE, TALOS_OPERATION, VERSION
from ichord.kube.client import KubeClient, from_kubeconfig, in_cluster
from ichord.kube.events import EventRecorder
from ichord.leader import LeaderElector, default_identity
from ichord.operations.cert_expiry import DEFAULT_WARNING_DAYS, forget_cluster
from ichord.server import HealthServer
from ichord.settings import Timing
from ichord.watchers.informer import Informer, Resource
from ichord.watchers.routing import Router

log = structlog.get_logger("ichord.daemon")


@dataclass
class DaemonSettings:
    kubeconfig: str | None = None
    namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE", "ichord-system"))
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or default_identity())
    node_name: str | None = field(default_factory=lambda: os.environ.get("NODE_NAME"))
    metrics_host: str = "0.0.0.0"  # noqa: S104 - the pod's metrics port is scraped from outside
    metrics_port: int = 8080
    port_file: str | None = None  # where the bound metrics port is written (tests, port 0)
    timing: Timing = field(default_factory=Timing.from_env)
    resync: float | None = None
    certificate_expiry_warning_days: float = DEFAULT_WARNING_DAYS


async def make_client(settings: DaemonSettings) -> KubeClient:
    if settings.kubeconfig:
        return await from_kubeconfig(settings.kubeconfig, timing=settings.timing, namespace=settings.namespace)
    return in_cluster(timing=settings.timing, namespace=settings.namespace)


def _resource(kind: str) -> Resource:
    return Resource(GROUP, VERSION, PLURALS[kind])


class Daemon:
    def __init__(self, settings: DaemonSettings, kube: KubeClient) -> None:
        self.settings = settings
        self.kube = kube
        timing = settings.timing
        self.clusters = Informer(kube, _resource(TALOS_CLUSTER), timing=timing)
        self.machines = Informer(kube, _resource(TALOS_MACHINE), timing=timing)
        self.operations = Informer(kube, _resource(TALOS_OPERATION), timing=timing)
        self.recorder = EventRecorder(kube, instance=settings.identity)
        self.runtime = Runtime(kube, settings.namespace, self.clusters, self.machines, self.operations,
                               self.recorder, timing,
                               resync=settings.resync if settings.resync is not None else timing.drift_resync,
                               warning_days=settings.certificate_expiry_warning_days)
        self.server = HealthServer(ready_checks={
            "informers": lambda: all(i.synced.is_set() for i in (self.clusters, self.machines, self.operations)),
        })
        self.router = Router(self._tell)
        self.clusters.add_handler(self.router.on_cluster)
        self.machines.add_handler(self.router.on_machine)
        self.operations.add_handler(self.router.on_operation)
        self.supervisor: Supervisor | None = None
        self._reconcilers: dict[str, ClusterReconciler] = {}

    # ---- routing ----------------------------------------------------------------------------

    def _tell(self, namespace: str, cluster: str, obj: tuple[str, str], reason: str) -> None:
        if self.supervisor is None:
            return
        key = f"{namespace}/{cluster}"
        if obj[0] == TALOS_CLUSTER and reason == "DELETED" and key not in self._known_clusters():
            # Nothing refers to the cluster any more: stop its actor and drop its series.
            self.supervisor.stop(key)
            rec = self._reconcilers.pop(key, None)
            if rec is not None:
                rec.close()
            forget_cluster(namespace, cluster)
            return
        self.supervisor.tell(key, obj, reason)

    def _step_for(self, key: str, _actor: ClusterActor) -> StepFn:
        rec = self._reconcilers.get(key)
        if rec is None:
            ns, name = key.split("/", 1)
            rec = self._reconcilers[key] = ClusterReconciler(self.runtime, ns, name)
        return rec.step

    def _known_clusters(self) -> set[str]:
        keys = {f"{ns}/{name}" for ns, name in self.clusters.cache}
        for (ns, _), obj in self.machines.cache.items():
            cluster = cluster_of(obj)
            if cluster:
                keys.add(f"{ns}/{cluster}")
        return keys

    # ---- leading ----------------------------------------------------------------------------

    async def lead(self) -> None:
        log.info("leading; starting the cluster actors", identity=self.settings.identity)
        for inf in (self.clusters, self.machines, self.operations):
            await inf.wait_synced()
        try:
            async with anyio.create_task_group() as tg:
                self.supervisor = Supervisor(tg, self._step_for)
                self.router.active = True
                for key in sorted(self._known_clusters()):
                    self.supervisor.ensure(key)
                await anyio.sleep_forever()
        finally:
            self.router.active = False
            self.supervisor = None
            for rec in self._reconcilers.values():
                rec.close()
            self._reconcilers.clear()

    # ---- the tree ---------------------------------------------------------------------------

    async def run(self) -> None:
        elector = LeaderElector(self.kube, namespace=self.settings.namespace, name=LEADER_LEASE,
                                identity=self.settings.identity, timing=self.settings.timing)
        async with anyio.create_task_group() as tg:
            port = await tg.start(self.server.serve, self.settings.metrics_host, self.settings.metrics_port)
            if self.settings.port_file:
                await anyio.Path(self.settings.port_file).write_text(f"{port}\n")
            log.info("serving /metrics /healthz /readyz", port=port)
            tg.start_soon(self.recorder.run)
            for inf in (self.clusters, self.machines, self.operations):
                tg.start_soon(inf.run)
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
            await elector.run(self.lead)
            tg.cancel_scope.cancel()


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            scope.cancel()
            return


async def run_daemon(settings: DaemonSettings) -> None:
    kube = await make_client(settings)
    try:
        await Daemon(settings, kube).run()
    finally:
        with anyio.CancelScope(shield=True):
            await kube.close()
