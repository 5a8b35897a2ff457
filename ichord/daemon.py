"""``ichord run``: the task tree of docs/architecture.md.

    ichord run
     ├─ http server: /metrics /healthz /readyz              (every replica)
     ├─ event recorder                                       (every replica)
     ├─ informers: TalosCluster, TalosMachine, TalosOperation (every replica)
     ├─ trust sync (event-driven + tick)                     (every replica)
     └─ leader elector  ──when leading──> actor system
                                            ├─ ClusterActor(ns/name) x N
                                            └─ supervisor (restarts a crashed actor with backoff)

Losing leadership cancels the actor system and exits non-zero (LeadershipLost); SIGTERM cancels the
tree, and the leader Lease is released if this process still holds it.

Start-up (docs/decisions.md#trust-pool): the trust pool loads the CAs a previous container published,
then the client is built on the pool; the HTTP server starts, then the API wait, then the rest of the
tree. A container restarted mid-rotation trusts the new Kubernetes CA before its first request.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from ichord.actors.actor import ClusterActor, StepFn, Supervisor
from ichord.actors.cluster import ClusterReconciler
from ichord.actors.runtime import Runtime
from ichord.api.names import (
    BUNDLE_LABEL,
    GROUP,
    LEADER_LEASE,
    PLURALS,
    TALOS_CLUSTER,
    TALOS_MACHINE,
    TALOS_OPERATION,
    VERSION,
)
from ichord.api.views import cluster_ref
from ichord.errors import IchordError
from ichord.kube.client import SERVICE_ACCOUNT_DIR, KubeClient, file_trust, from_kubeconfig, in_cluster
from ichord.kube.errors import KubeError
from ichord.kube.events import EventRecorder
from ichord.kube.kubeconfig_ca import kubeconfig_ca
from ichord.leader import LeaderElector, default_identity
from ichord.metrics import REGISTRY
from ichord.operations.cert_expiry import DEFAULT_WARNING_DAYS, forget_cluster
from ichord.operations.scope import TrustHooks
from ichord.safefile import write_file
from ichord.server import HealthServer
from ichord.settings import Timing
from ichord.trust import SharedTrust
from ichord.trust.pool import DEFAULT_TRUST_FILE, TrustPool, describe
from ichord.trust.sync import TrustSync
from ichord.watchers import leader_status
from ichord.watchers.compact import interned
from ichord.watchers.informer import Informer, Resource
from ichord.watchers.routing import Router
from ichord.watchers.state_metrics import StateCollector

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
    port_file_force: bool = False  # replace an existing port file (else it is refused: docs/decisions.md#cli-files)
    timing: Timing = field(default_factory=Timing.from_env)
    resync: float | None = None
    certificate_expiry_warning_days: float = DEFAULT_WARNING_DAYS
    #: The trust pool (docs/decisions.md#rotation-state): off, the client trusts its CA file alone and nothing is
    #: published.
    trust_pool: bool = True
    #: Where the extras are published; None: the emptyDir path in-cluster, a per-kubeconfig file with a kubeconfig.
    trust_file: str | None = None
    #: With a kubeconfig: the pool's base CA file instead of the kubeconfig's own CA (re-read per request).
    ca_file: str | None = None
    #: Namespaces besides a TalosCluster's own that its spec.secretsRef may name (--allow-secret-namespace).
    allowed_secret_namespaces: frozenset[str] = frozenset()
    #: Namespaces besides its own where ichord is granted bundle Secrets and lock Leases (--watch-namespace; the
    #: chart's watchNamespaces): its bundle Secret informers run there. A cluster anywhere else is reconciled all the
    #: same, and says Ready=False/Forbidden where the management API refuses (ichord.kube.forbidden).
    watch_namespaces: frozenset[str] = frozenset()

    def bundle_namespaces(self) -> list[str]:
        """Where the labelled bundle Secrets are watched: each namespace ichord is granted Secrets in by name. Serving
        every namespace, a cluster's bundle outside these is read on each of its steps all the same (a watch of every
        Secret of the management cluster is not worth its cost for a wake-up)."""
        return sorted({self.namespace, *self.watch_namespaces, *self.allowed_secret_namespaces})

    def resolved_trust_file(self) -> Path | None:
        if self.trust_file:
            return Path(self.trust_file)
        if self.kubeconfig:
            return default_trust_file(self.kubeconfig)
        return DEFAULT_TRUST_FILE


def default_trust_file(kubeconfig: str | Path, *, root: str = "~/.ichord/trust") -> Path:
    """Where a run with ``kubeconfig`` keeps the extra CAs: one file per kubeconfig, under ~/.ichord/trust.

    It must outlive the process: once a rotation of the cluster ichord talks to has completed, the API server
    serves only the new CA, which the kubeconfig does not hold, so a restarted process needs the file.
    """
    digest = hashlib.sha256(str(Path(kubeconfig).expanduser().resolve()).encode()).hexdigest()[:16]
    return Path(root).expanduser() / digest / "kubernetes-ca.crt"


#: Where versions before the ``ichord`` name kept the per-kubeconfig trust file.
LEGACY_TRUST_ROOT = "~/.ichor/trust"


def adopt_legacy_trust_file(settings: DaemonSettings, trust_file: Path) -> None:
    """A per-kubeconfig trust file an earlier version wrote under ~/.ichor/trust is copied to the new place once:
    after a completed rotation it holds the only CA the API server is served by, so dropping it locks ichord out."""
    if settings.trust_file or not settings.kubeconfig or trust_file.exists():
        return
    legacy = default_trust_file(settings.kubeconfig, root=LEGACY_TRUST_ROOT)
    if not legacy.is_file():
        return
    trust_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy2(legacy, trust_file)
    log.info("trust file moved to ichord's directory (the old one is left in place)", old=str(legacy),
             new=str(trust_file))


class APIUnavailableError(IchordError):
    """The Kubernetes API did not answer during the start-up wait."""


def build_pool(settings: DaemonSettings) -> TrustPool:
    """The pool's base: --ca-file, else the kubeconfig's own CA (file or inline data); ca.crt in-cluster.

    Out of cluster the kubeconfig's CA is what the client trusted until now, so the pool only adds to it:
    ichord talks to an API server it can be rotated under (``ichord sim``, a self-managed cluster) and must
    trust the new CA before Issuing exactly as in a pod. A kubeconfig naming no CA leaves the pool without a
    base: ``rotation_refusal`` then refuses Kubernetes-CA rotations rather than lock the process out.
    """
    if settings.ca_file:
        return TrustPool(settings.ca_file, describe_base=f"--ca-file {settings.ca_file}")
    if settings.kubeconfig:
        ca = kubeconfig_ca(settings.kubeconfig)
        if ca.file is not None:
            return TrustPool(ca.file, describe_base=ca.description)
        return TrustPool(base_data=ca.data, describe_base=ca.description)
    path = SERVICE_ACCOUNT_DIR / "ca.crt"
    return TrustPool(path, describe_base=f"the service account's {path}")


async def make_client(settings: DaemonSettings, pool: TrustPool | None = None) -> KubeClient:
    """The client; its trust comes from ``pool`` when the pool is on and has a base, else from its own CA."""
    trust = None
    if pool is not None and settings.trust_pool and pool.has_base:
        trust = pool.source
    elif settings.ca_file:
        trust = file_trust(settings.ca_file)  # pool off: the CA file alone, still re-read per request
    if settings.kubeconfig:
        return await from_kubeconfig(settings.kubeconfig, timing=settings.timing, namespace=settings.namespace,
                                     trust=trust)
    return in_cluster(timing=settings.timing, namespace=settings.namespace, trust=trust)


async def wait_for_api(kube: KubeClient, *, give_up_after: float, log_interval: float,
                       probe_interval: float) -> None:
    """Probe ``/version`` until it answers; a failed probe is logged at most once per ``log_interval``.

    Raises APIUnavailableError naming the last error when ``give_up_after`` seconds have passed.
    """
    start = time.monotonic()
    last_logged: float | None = None
    suppressed = 0
    while True:
        try:
            with anyio.fail_after(min(kube.timeout, give_up_after)):
                await kube.raw("GET", "/version")
            if last_logged is not None:
                log.info("the Kubernetes API answers", host=kube.host, waited=round(time.monotonic() - start, 3))
            return
        except (KubeError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
        now = time.monotonic()
        if now - start >= give_up_after:
            raise APIUnavailableError(f"the Kubernetes API at {kube.host} did not answer within {give_up_after:g} s; "
                                      f"last error: {error}")
        if last_logged is None or now - last_logged >= log_interval:
            log.warning("waiting for the Kubernetes API", host=kube.host, error=error,
                        failed_probes_not_logged=suppressed)
            last_logged, suppressed = now, 0
        else:
            suppressed += 1
        await anyio.sleep(min(probe_interval, max(0.0, give_up_after - (now - start))))


def metadata_only(obj: dict[str, Any]) -> dict[str, Any]:
    """What the bundle informer keeps of a Secret: its metadata (no data, no managedFields), strings interned."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return interned({"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": meta})


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the TalosCluster, TalosMachine and TalosOperation informers keep: all but ``metadata.managedFields``.

    A real API server's field-manager record is often as large as the object and nothing here reads it. Cached
    copies only ever go back as merge patches of status and metadata (kube/status.py), and an update that omits
    managedFields keeps the server's own. The input is left as it is: the copy, with its strings interned
    (watchers/compact.py), drops the one key."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return interned(obj)
    return interned({**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}})


def _resource(kind: str) -> Resource:
    return Resource(GROUP, VERSION, PLURALS[kind])


class Daemon:
    def __init__(self, settings: DaemonSettings, kube: KubeClient, pool: TrustPool | None = None) -> None:
        self.settings = settings
        self.kube = kube
        timing = settings.timing
        self.clusters = Informer(kube, _resource(TALOS_CLUSTER), timing=timing, transform=without_managed_fields)
        self.machines = Informer(kube, _resource(TALOS_MACHINE), timing=timing, transform=without_managed_fields)
        self.operations = Informer(kube, _resource(TALOS_OPERATION), timing=timing, transform=without_managed_fields)
        # The bundle Secrets, by label and metadata only: a new or changed bundle wakes its cluster at once. One
        # per namespace ichord is granted Secrets in (its own, the served and the allowed ones); a cluster elsewhere
        # has its bundle read on each of its steps all the same. They only wake clusters (every step reads its
        # bundle uncached), so neither leading nor /readyz waits for them: a namespace whose grant was taken away
        # (403 on the list) must not stop every other cluster; its clusters say Forbidden in their conditions.
        self.bundles = [Informer(kube, Resource("", "v1", "secrets", ns), timing=timing, label_selector=BUNDLE_LABEL,
                                 transform=metadata_only)
                        for ns in settings.bundle_namespaces()]
        self.trust_sync: TrustSync | None = None
        hooks = TrustHooks()  # without a pool, the rotation's trust hooks do nothing
        if pool is not None and settings.trust_pool:
            hooks = SharedTrust(pool, settings.resolved_trust_file()).hooks()
            self.trust_sync = TrustSync(kube, pool, trust_file=settings.resolved_trust_file(), timing=timing,
                                        cluster_cache=self.clusters.get,
                                        allowed_secret_namespaces=settings.allowed_secret_namespaces)
            # First in line: the publish races the rotation's next stage (docs/decisions.md#rotation-state).
            self.operations.add_handler(self.trust_sync.on_operation)
        self.recorder = EventRecorder(kube, instance=settings.identity)
        self.runtime = Runtime(kube, settings.namespace, self.clusters, self.machines, self.operations,
                               self.recorder, timing,
                               resync=settings.resync if settings.resync is not None else timing.drift_resync,
                               warning_days=settings.certificate_expiry_warning_days, trust=hooks,
                               allowed_secret_namespaces=settings.allowed_secret_namespaces)
        self.server = HealthServer(ready_checks={
            "informers": lambda: all(i.synced.is_set() for i in self._object_informers()),
            "api": lambda: kube.reachability.reachable(timing.api_unready_grace),
        })
        self.router = Router(self._tell, self._clusters_of_secret)
        self.runtime.wake = self._tell
        for bundles in self.bundles:
            bundles.add_handler(self.router.on_bundle_secret)
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
        if reason == "DELETED" and not self._referred(namespace, cluster):
            # Nothing refers to the cluster any more (it, and the last machine or operation naming it, are gone,
            # in whichever order): stop its actor and drop its series, the mailbox's among them.
            self.supervisor.stop(key)
            rec = self._reconcilers.pop(key, None)
            if rec is not None:
                rec.close()
            forget_cluster(namespace, cluster)
            return
        self.supervisor.tell(key, obj, reason)

    def _informers(self) -> tuple[Informer, ...]:
        return (*self._object_informers(), *self.bundles)

    def _object_informers(self) -> tuple[Informer, ...]:
        """The informers a leader needs synced before its actors start: ichord's own kinds."""
        return self.clusters, self.machines, self.operations

    def _clusters_of_secret(self, namespace: str, name: str) -> list[tuple[str, str]]:
        """The clusters whose spec.secretsRef resolves to this Secret: from the index the clusters informer's first
        handler keeps (actors/owners.py), so a bundle event finds its clusters without scanning them all (a relist
        of 5,000 bundles was 5,000 x 5,000 views, docs/scaling.md)."""
        return self.runtime.bundle_owners.members((namespace, name))

    def _step_for(self, key: str, _actor: ClusterActor) -> StepFn:
        rec = self._reconcilers.get(key)
        if rec is None:
            ns, name = key.split("/", 1)
            rec = self._reconcilers[key] = ClusterReconciler(self.runtime, ns, name)
        return rec.step

    def _referred(self, namespace: str, cluster: str) -> bool:
        """Whether the cluster, or a machine or operation naming it, is still cached (the indexes see an event
        before the router does)."""
        return ((namespace, cluster) in self.clusters.cache
                or bool(self.runtime.machine_index.keys(namespace, cluster))
                or bool(self.runtime.operation_index.keys(namespace, cluster)))

    def _known_clusters(self) -> set[str]:
        """Every cluster something refers to: its actor reports on machines and operations naming a missing one."""
        keys = {f"{ns}/{name}" for ns, name in self.clusters.cache}
        for cache in (self.machines.cache, self.operations.cache):
            for (ns, _), obj in cache.items():
                cluster = cluster_ref(obj)
                if cluster:
                    keys.add(f"{ns}/{cluster}")
        return keys

    # ---- leading ----------------------------------------------------------------------------

    async def lead(self) -> None:
        log.info("leading; starting the cluster actors", identity=self.settings.identity)
        for inf in self._object_informers():
            await inf.wait_synced()
        # Steps read the operations from the cache (Runtime.operations_of): as fresh as the API now, before any step,
        # so no write of the leader before this one is missed (docs/architecture.md#read-your-writes). One LIST.
        await self.operations.relist()
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
            with anyio.CancelScope(shield=True):  # leadership lost or stopping: the operations' held clients go
                await self.runtime.registry.close()

    # ---- the tree ---------------------------------------------------------------------------

    async def run(self) -> None:
        elector = LeaderElector(self.kube, namespace=self.settings.namespace, name=LEADER_LEASE,
                                identity=self.settings.identity, timing=self.settings.timing)
        # The per-object series, from the informers at each scrape, on every replica (watchers/state_metrics.py).
        state = StateCollector(self.clusters, self.operations)
        REGISTRY.register(state)
        try:
            await self._run(elector)
        finally:
            REGISTRY.unregister(state)

    async def _run(self, elector: LeaderElector) -> None:
        async with anyio.create_task_group() as tg:
            # SIGTERM handled from here on: the receiver is in place before the port is served (and written), so a
            # process that shows its port stops cleanly on SIGTERM instead of dying of the signal's default action.
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
            port = await tg.start(self.server.serve, self.settings.metrics_host, self.settings.metrics_port)
            if self.settings.port_file:
                await anyio.to_thread.run_sync(functools.partial(
                    write_file, Path(self.settings.port_file), f"{port}\n".encode(),
                    force=self.settings.port_file_force))
            log.info("serving /metrics /healthz /readyz", port=port)
            # /healthz answers meanwhile (the loop is alive); /readyz stays false until the informers sync.
            t = self.settings.timing
            await wait_for_api(self.kube, give_up_after=t.api_wait_timeout, log_interval=t.api_wait_log_interval,
                               probe_interval=t.api_wait_probe)
            tg.start_soon(self.recorder.run)
            for inf in self._informers():
                tg.start_soon(inf.run)
            if self.trust_sync is not None:
                tg.start_soon(self.trust_sync.run)
            # Every replica: LeaderElected=False/NoLeader on the clusters once none has led for longer than the Lease.
            tg.start_soon(leader_status.watch, self.kube, self.clusters, elector,
                          f"{self.settings.namespace}/{LEADER_LEASE}", t.retry_period)
            tg.start_soon(probe_api, self.kube, t.api_unready_grace / 3)
            await elector.run(self.lead)
            tg.cancel_scope.cancel()


async def probe_api(kube: KubeClient, interval: float) -> None:
    """Ask ``/version`` whenever no request has reached the API server for ``interval``, so /readyz tells the
    truth in a quiet process too (an idle replica's open watches make no new request for minutes)."""
    while True:
        await anyio.sleep(interval)
        since = kube.reachability.since_ok()
        if since is not None and since < interval and kube.reachability.failing_since is None:
            continue
        try:
            with anyio.fail_after(max(kube.timeout, interval)):
                await kube.raw("GET", "/version")
        except (KubeError, TimeoutError) as exc:
            log.debug("API probe failed", host=kube.host, error=str(exc) or type(exc).__name__)


def log_trust(pool: TrustPool, trust_file: Path | None) -> None:
    """The start-up line that says which CAs the client trusts and why (subjects and validity only)."""
    if not pool.has_base:
        log.warning("the trust pool has no base CA: the client verifies the API server with the system's roots; "
                    "ichord refuses to rotate the Kubernetes CA of a cluster while it cannot tell whether it is "
                    "its own", base=pool.base_description)
        return
    log.info("trust pool on", base=pool.base_description,
             base_certificates=[describe(c) for c in pool.base_certificates()],
             extra_certificates=len(pool.extras), trust_file=str(trust_file) if trust_file else None)


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            scope.cancel()
            return


async def run_daemon(settings: DaemonSettings) -> None:
    pool = build_pool(settings)
    trust_file = settings.resolved_trust_file()
    if settings.trust_pool:
        if trust_file is not None:
            adopt_legacy_trust_file(settings, trust_file)
            pool.load(trust_file)  # before the API wait: a restarted container trusts the new CA at once
        log_trust(pool, trust_file)
    else:
        log.warning("the trust pool is off (--no-trust-pool): a Kubernetes CA rotation of the cluster this "
                    "process talks to breaks its API access at Issuing until its CA file carries the new CA")
    kube = await make_client(settings, pool)
    try:
        await Daemon(settings, kube, pool).run()  # the API wait runs first inside, with /healthz up
    finally:
        with anyio.CancelScope(shield=True):
            await kube.close()
