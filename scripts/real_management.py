"""``--management real`` for the in-process benchmarks: ichord's objects on a real kube-apiserver + etcd.

The server is the one the real test tier starts (tests/real/controlplane.py, binaries from scripts/tools.sh); the
managed clusters stay simulated. A benchmark builds its simulated cluster as usual (SimEnvironment, a separate
management API) and copies ichord's objects of its namespace (the bundle Secret, the TalosCluster, the TalosMachines)
onto the real server, which the daemon's code then talks to instead. The server's own request counts come from
its /metrics (apiserver_request_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.real.controlplane: the real tier's server

from bench_idle import WRITE_VERBS, server_counts

from ichord.api.names import GROUP, VERSION
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import AlreadyExists
from ichord.settings import Timing
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from ichord.sim.kube.store import Store
from tests.real.controlplane import ControlPlane, ControlPlaneError

__all__ = ["ControlPlaneError", "RealManagement", "counts_of", "create_objects", "documents", "running", "started"]

#: What a benchmark's cluster is made of on the management API, in creation order: (group, version, plural).
OBJECTS = (("", "v1", "secrets"), (GROUP, VERSION, "talosclusters"), (GROUP, VERSION, "talosmachines"))


class RealManagement:
    """A started control plane, a client of it with the benchmark's timing, and its request counts."""

    def __init__(self, plane: ControlPlane, kube: KubeClient) -> None:
        self.plane, self.kube = plane, kube

    async def client(self, timing: Timing) -> KubeClient:
        """A client for the code under test with the benchmark's (scaled) ``timing``, but a real server's request
        timeouts: a scaled one (0.3 s at scale 0.01) is shorter than the server's own latency under load."""
        real = Timing()
        return await from_kubeconfig(self.plane.admin_kubeconfig, timing=replace(
            timing, kube_request_timeout=real.kube_request_timeout, min_call_timeout=real.min_call_timeout,
            watch_inactivity_timeout=real.watch_inactivity_timeout))

    def counts(self) -> tuple[Counter[str], Counter[str], int]:
        """Requests by verb, by verb+resource, and the total, as the server counted them so far."""
        return counts_of(self.plane)

    async def copy_namespace(self, store: Store, namespace: str) -> None:
        """The namespace and ichord's objects in it, from a simulator's store onto the real server (spec only)."""
        await create_objects(self.kube, namespace, documents(store, namespace))


def documents(store: Store, namespace: str) -> list[tuple[str, str, dict[str, Any]]]:
    """ichord's objects of ``namespace`` in a simulator's store, as (API base path, plural, document to create):
    spec, labels and annotations only (picklable: a benchmark's simulators may run in a process of their own)."""
    out = []
    for group, version, plural in OBJECTS:
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        for obj in store.peek(store.resolve(group, version, plural), namespace):
            meta = obj["metadata"]
            doc = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
            doc["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
            out.append((base, plural, doc))
    return out


async def create_objects(kube: KubeClient, namespace: str, docs: list[tuple[str, str, dict[str, Any]]]) -> None:
    """The namespace (unless it exists) and ``docs`` (``documents``' answer) on the real server."""
    with contextlib.suppress(AlreadyExists):  # a second world's objects in the same namespace
        await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    for base, plural, doc in docs:
        await kube.raw("POST", f"{base}/namespaces/{namespace}/{plural}", body=doc)


def delta(after: tuple[Counter[str], Counter[str], int], before: tuple[Counter[str], Counter[str], int],
          ) -> dict[str, Any]:
    """The server's requests between two ``counts``: the total, by verb, and the writes by resource."""
    by_verb, by_resource = after[0] - before[0], after[1] - before[1]
    writes = {k: v for k, v in sorted(by_resource.items()) if k.split(" ", 1)[0] in WRITE_VERBS}
    return {"total": after[2] - before[2], "by_verb": dict(sorted(by_verb.items())), "writes": writes}


@contextlib.contextmanager
def started(workdir: Path) -> Iterator[ControlPlane]:
    """A real kube-apiserver + etcd with ichord's CRDs established, for synchronous callers (a benchmark that forks
    its simulators first); ControlPlaneError when the tools are not built."""
    plane = ControlPlane.from_tools(workdir / "apiserver")
    try:
        plane.start()
        plane.establish_crds(DEFAULT_CRD_DIR)
        yield plane
    finally:
        plane.stop()


def counts_of(plane: ControlPlane) -> tuple[Counter[str], Counter[str], int]:
    """Requests by verb, by verb+resource, and the total, as the server counted them so far."""
    return server_counts(str(plane.request("GET", "/metrics")))


@contextlib.asynccontextmanager
async def running(workdir: Path, timing: Timing | None = None) -> AsyncIterator[RealManagement]:
    """A real kube-apiserver + etcd with ichord's CRDs established; ControlPlaneError when the tools are not built.
    ``kube`` (``timing``'s, unscaled by default) is the benchmark's own client: its objects, its counts."""
    plane = ControlPlane.from_tools(workdir / "apiserver")
    try:
        await asyncio.to_thread(plane.start)
        await asyncio.to_thread(plane.establish_crds, DEFAULT_CRD_DIR)
        async with await from_kubeconfig(plane.admin_kubeconfig, timing=timing or Timing()) as kube:
            yield RealManagement(plane, kube)
    finally:
        plane.stop()
