"""The trust sync: every replica trusts a rotation's new Kubernetes CA before Issuing
(docs/decisions.md#rotation-state).

Runs on every replica, not leader-gated: the follower's informers and API calls go through the
same pool, and the follower never runs the rotation. A handler on the TalosOperation informer
requests a pass on every add/update of a ca-rotation under way (a stage set, not completed: the
creation event, with no status, is ignored) and when a rotation turns Completed; a tick is the
fallback. Passes run only in this loop, which waits on the tick or a one-slot trigger, so two passes
never run at once and a burst of events costs at most one extra pass.

A pass lists the operations uncached. For each rotation under way it reads the cluster's bundle
Secret uncached and trusts the certificate (never the key) of ``rotation.yaml``'s Kubernetes CA,
then publishes, but only for the cluster this process's API server belongs to (the base ca.crt holds
its current or new CA): another cluster's CA would never reach the base, so it could never be
pruned. With none under way it calls ``clear_once_base_trusts``: a pending rotation's CA is never
in the base yet, and one that starts again is republished long before Issuing.

A rotation an event showed under way is trusted and published first, before the LIST: the event is
the operation as written, and trusting one more CA is never wrong (only clearing needs the whole,
uncached list). Its bundle Secret is still read uncached; the LIST then settles everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog

from ichord.api.names import KIND_CA_ROTATION, Phase
from ichord.api.views import ClusterView, OperationView
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError
from ichord.operations.bundle_source import BundleSourceError, read_cluster_bundle
from ichord.pki.ca import CAKind
from ichord.pki.rotation import Target
from ichord.settings import Timing
from ichord.trust.pool import TrustPool, TrustPoolError
from ichord.watchers.informer import WatchEvent

log = structlog.get_logger("ichord.trust.sync")

Obj = dict[str, Any]


@dataclass
class PassResult:
    underway: int = 0
    trusted: int = 0  # CAs of rotations under way now in the pool
    other_clusters: int = 0  # rotations of clusters this process's API server is not part of (not trusted)
    published: bool = False
    cleared: bool = False
    failed: bool = False


class TrustSync:
    def __init__(self, kube: KubeClient, pool: TrustPool, *, trust_file: str | Path | None, timing: Timing,
                 cluster_cache: Callable[[str, str], Obj | None] | None = None,
                 allowed_secret_namespaces: frozenset[str] = frozenset()) -> None:
        """``cluster_cache(ns, name)`` reads a TalosCluster from an informer (its secretsRef), else it is read from
        the API; a bundle Secret is read where the cluster's secretsRef resolves (``allowed_secret_namespaces``:
        the namespaces besides the cluster's own it may name)."""
        self.kube = kube
        self.pool = pool
        self.allowed_secret_namespaces = allowed_secret_namespaces
        self.trust_file = Path(trust_file) if trust_file is not None else None
        self.timing = timing
        self._cluster_cache = cluster_cache
        self._requested = False  # the one slot: set by request(), taken by the loop
        #: Rotations events showed under way since the last pass, by namespace/name: trusted before the LIST.
        self._evented: dict[tuple[str, str], Obj] = {}
        self._wake: anyio.Event | None = None
        self.passes = 0

    # ---- the trigger ------------------------------------------------------------------------

    def request(self) -> None:
        """Ask for a pass; never blocks: with one already pending this one is folded into it."""
        self._requested = True
        if self._wake is not None:
            self._wake.set()

    def on_operation(self, event: WatchEvent) -> None:
        """TalosOperation informer handler; returns at once."""
        view = OperationView.of(event.obj)
        if event.type == "DELETED" or view.kind != KIND_CA_ROTATION:
            return
        if rotation_under_way(view):
            self._evented[(view.namespace, view.name)] = event.obj
            self.request()
        elif view.phase == Phase.COMPLETED and (event.old is None
                                                or OperationView.of(event.old).phase != Phase.COMPLETED):
            self.request()  # the rotation completed: try the clear now rather than on the next tick

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: a pass on each trigger, and at least one per tick."""
        while True:
            self._wake = anyio.Event()
            if not self._requested:
                with anyio.move_on_after(self.timing.trust_sync_tick):
                    await self._wake.wait()
            self._requested = False  # a request from now on (even during the pass) earns one more pass
            try:
                await self.pass_once()
            except Exception:  # a bug in one pass must not take the replica down; the next one retries
                log.exception("trust sync pass failed")

    async def pass_once(self) -> PassResult:
        self.passes += 1
        result = PassResult()
        evented, self._evented = list(self._evented.values()), {}
        done: set[tuple[str, str, str]] = set()  # rotations trusted in this pass already
        if evented:
            # The LIST costs a round trip on the way from Accepting to the publish; the event already says.
            await self._trust(evented, result, done)
            self._publish(result)
        try:
            ops, _ = await crds.operations(self.kube).list_objects(None)
        except KubeError as exc:
            log.warning("trust sync cannot list the operations; trying again on the next event or tick",
                        error=str(exc))
            result.failed = True
            return result
        underway = [op for op in ops if rotation_under_way(OperationView.of(op))]
        result.underway = len(underway)
        if not underway:
            try:
                result.cleared = self.pool.clear_once_base_trusts(self.trust_file)
            except OSError as exc:
                log.warning("cannot remove the trust file", path=str(self.trust_file),
                            error=exc.strerror or type(exc).__name__)
            return result
        await self._trust([op for op in underway if _identity(op) not in done], result, done)
        self._publish(result)
        return result

    async def _trust(self, ops: list[Obj], result: PassResult, done: set[tuple[str, str, str]]) -> None:
        """Add the new Kubernetes CA of each rotation (of this process's cluster) to the pool."""
        for op in ops:
            try:
                cert = await self._new_kubernetes_ca(op)
            except (KubeError, BundleSourceError) as exc:
                meta = op.get("metadata") or {}
                log.warning("trust sync cannot read the rotation's new Kubernetes CA",
                            operation=f"{meta.get('namespace')}/{meta.get('name')}", error=str(exc))
                result.failed = True
                continue
            if cert is None:
                continue
            new, current = cert
            if not self.pool.trusts_any([current, new] if current is not None else [new]):
                result.other_clusters += 1  # its CA would never reach our ca.crt: trusting it could never end
                continue
            try:
                self.pool.add(new)
            except TrustPoolError as exc:
                log.error("the rotation's new Kubernetes CA is not a certificate the pool can trust", error=str(exc))
                result.failed = True
                continue
            result.trusted += 1
            done.add(_identity(op))

    def _publish(self, result: PassResult) -> None:
        try:
            result.published = self.pool.publish(self.trust_file) or result.published
        except OSError as exc:
            log.warning("cannot publish the trust file; this process trusts the new CA, a restarted container "
                        "will not until the next pass", path=str(self.trust_file),
                        error=exc.strerror or type(exc).__name__)
            result.failed = True

    async def _new_kubernetes_ca(self, op: Obj) -> tuple[bytes, bytes | None] | None:
        """(the new Kubernetes CA, the bundle's current one) of the rotation's cluster; None when there is none."""
        view = OperationView.of(op)
        if not view.cluster:
            return None
        cluster = self._cluster_cache(view.namespace, view.cluster) if self._cluster_cache is not None else None
        if cluster is None:
            cluster = await crds.clusters(self.kube).get(view.namespace, view.cluster)
        secret_name = ClusterView.of(cluster).secret_name
        if not secret_name:
            return None
        # Uncached: rotation.yaml decides. Where the cluster's secretsRef resolves, refused across namespaces.
        read = await read_cluster_bundle(self.kube, ClusterView.of(cluster), self.allowed_secret_namespaces)
        # Not saved yet (the leader saves it before it sets Accepting) or already dropped: None.
        new = read.rotation_ca_certificate(Target.KUBERNETES)  # the certificate only, never the key
        if new is None:
            return None
        return new, read.ca_certificate(CAKind.KUBERNETES)


def rotation_under_way(view: OperationView) -> bool:
    """A ca-rotation under way: the trust pool trusts its new Kubernetes CA until it completes."""
    return view.kind == KIND_CA_ROTATION and view.under_way


def _identity(op: Obj) -> tuple[str, str, str]:
    meta = op.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
