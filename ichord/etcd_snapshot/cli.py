"""``ichord cluster etcd-snapshot NAME [-n NS] -f FILE``: an etcd snapshot of a Talos cluster, to a file.

Reads the TalosCluster, its approved control planes and its bundle Secret with the user's kubeconfig, mints a
client certificate with the role ``os:etcd:backup`` from the bundle's OS CA (during a CA rotation the new OS CA is
trusted too, and signs when the nodes no longer accept the old one), takes the snapshot from a healthy control
plane (take.py) and writes it atomically, never over an existing file (file.py). Exit codes: 0 written; 2 bad
input (the file exists, its directory does not, no such cluster or Secret, no approved control plane), nothing
contacted or written; 1 the snapshot could not be taken (no healthy control plane, a node failed, a damaged
stream), nothing written.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ichord.api import views
from ichord.errors import IchordError
from ichord.etcd_snapshot.file import (
    SnapshotDestinationError,
    SnapshotIntegrityError,
    SnapshotWriteError,
    check_destination,
)
from ichord.etcd_snapshot.take import BACKUP_ROLE, ControlPlane, NoHealthyControlPlane, Taken, take
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import NotFound
from ichord.operation_cli import namespace_name
from ichord.operations.bundle_source import read_cluster_bundle
from ichord.pki.rotation import Target
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle


class SnapshotInputError(IchordError):
    """The command was asked for something that cannot be done (exit 2, nothing written)."""


def register(sub: Any, cluster_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "etcd-snapshot",
        help="save an etcd snapshot of the cluster (Talos EtcdSnapshot from a healthy control plane) to a file",
        description=(
            "Take an etcd snapshot from a healthy control plane of the TalosCluster through the Talos API "
            "(EtcdSnapshot, with a client certificate of the role os:etcd:backup minted from the bundle Secret's "
            "OS CA) and write it to FILE: mode 0600, atomically, never over an existing file. Prints its size and "
            "SHA-256. The file is what `etcdutl snapshot restore` and `talosctl bootstrap --recover-from` take. "
            "Exit 0 written, 1 not taken (nothing written), 2 bad input (nothing contacted or written)."),
    )
    cluster_args(p)
    p.add_argument("-f", "--file", type=Path, required=True, help="the snapshot file to write (must not exist)")
    p.add_argument("--secret-namespace", type=namespace_name,
                   help="where the bundle Secret is (default: as the TalosCluster resolves it, its "
                        "spec.secretsRef.namespace or its own namespace)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        taken = asyncio.run(_run(args))
    except (SnapshotInputError, SnapshotDestinationError) as exc:
        print(f"ichord: {SCRUBBER.text(str(exc))}; nothing was written", file=sys.stderr)
        return 2
    except (NoHealthyControlPlane, SnapshotIntegrityError, SnapshotWriteError) as exc:
        print(f"ichord: {SCRUBBER.text(str(exc))}; nothing was written", file=sys.stderr)
        return 1
    f = taken.file
    print(f"wrote {f.path} (mode 0600): {f.size} bytes, sha256 {f.sha256}")
    print(f"from control plane {taken.machine} (etcd member {taken.member_id:x}, raft index {taken.revision}); "
          + ("etcd's SHA-256 of the database, at its end, verified" if f.trailer_verified
             else "the stream carried no SHA-256 of etcd's to verify"))
    return 0


async def _run(args: argparse.Namespace) -> Taken:
    path = check_destination(args.file, flag=None)
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await snapshot(kube, args.namespace or kube.namespace, args.name, path,
                              secret_namespace=args.secret_namespace)


async def snapshot(kube: KubeClient, namespace: str, name: str, path: Path, *,
                   secret_namespace: str | None = None) -> Taken:
    """The whole command: read what it needs, then take the snapshot to ``path``."""
    try:
        obj = await crds.clusters(kube).get(namespace, name)
    except NotFound:
        raise SnapshotInputError(f"TalosCluster {namespace}/{name} not found; check the name and -n") from None
    cluster = views.ClusterView.of(obj)
    if secret_namespace:
        spec = {**cluster.spec, "secretsRef": {**(cluster.spec.get("secretsRef") or {}),
                                               "namespace": secret_namespace}}
        cluster = views.ClusterView.of({**obj, "spec": spec})
    try:
        read = await read_cluster_bundle(kube, cluster, frozenset({cluster.secret_namespace}))
        bundle, rotation = read.full(), read.rotation()
    except IchordError as exc:
        raise SnapshotInputError(str(exc)) from None
    machines, _ = await crds.machines(kube).list_objects(namespace)
    control_planes = []
    for m in machines:
        try:
            view = views.MachineView.of(m)
        except views.MachineSpecError:
            continue
        if view.cluster == name and view.approved and view.is_control_plane:
            control_planes.append(ControlPlane(view.name, view.address))
    if not control_planes:
        raise SnapshotInputError(f"TalosCluster {namespace}/{name} has no approved control plane (TalosMachine with "
                                 "role controlplane and spec.approved: true) to take a snapshot from")
    control_planes.sort(key=lambda c: c.name)
    new_os = rotation.new.get(Target.TALOS) if rotation is not None else None
    trusted = [bundle.os.cert_pem] + ([new_os.cert_pem] if new_os is not None else [])
    dials = [DialBundle.of(bundle.os, trusted, roles=(BACKUP_ROLE,))]
    if new_os is not None:  # late in a rotation of the Talos CA the nodes accept only the new one
        dials.append(DialBundle.of(new_os, trusted, roles=(BACKUP_ROLE,)))
    for i, dial in enumerate(dials):
        async with TalosClient(dial) as talos:
            try:
                return await take(talos, control_planes, path)
            except NoHealthyControlPlane as exc:
                if i + 1 < len(dials) and exc.certificate_refused:
                    continue
                raise
    raise AssertionError("unreachable")
