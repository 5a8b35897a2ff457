"""MachineService.EtcdSnapshot on a simulated node, as machined serves it.

Control planes only (a worker answers Unimplemented "etcd snapshot is only available on control plane nodes"),
roles os:admin, os:operator and os:etcd:backup, the node's etcd member must run (else Unknown, as the etcd client
error machined wraps); the database streams as ``common.Data`` chunks. What streams is ``SimCluster``'s
``etcd_snapshot_source`` when a test sets one (the real tier streams a snapshot of the real etcd it runs),
else an etcd database written from the simulated etcd (etcd_db.py: bbolt's format, etcd's buckets, the SHA-256
last). Each snapshot served is a history event ``etcd_snapshot`` (node, size), so tests order it against reboots.

A handler of its own (grpclib merges the handlers' method maps), bound to the method path like the generated
stubs bind theirs: the request message lives in its own proto file (ichord/talos/proto/machine/etcd_snapshot.proto).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ichord.sim.talos import etcd_db
from ichord.sim.talos.services import ADMIN, _Base, _control_plane
from ichord.talos.client import ETCD_SNAPSHOT_PATH
from ichord.talos.proto.gen.common import common_pb2
from ichord.talos.proto.gen.machine.etcd_snapshot_pb2 import EtcdSnapshotRequest

if TYPE_CHECKING:
    from ichord.sim.talos.cluster import SimCluster
    from ichord.sim.talos.node import SimNode

#: machined's role table for EtcdSnapshot.
SNAPSHOT_ROLES = ADMIN | {"os:operator", "os:etcd:backup"}
#: Where a snapshot's bytes come from, when not from the simulated etcd.
SnapshotSource = Callable[[], Awaitable[bytes]]
CHUNK = 1 << 16


def simulated_snapshot(cluster: SimCluster) -> bytes:
    """An etcd database of the simulated cluster: its members and a key per member and revision step."""
    etcd = cluster.etcd
    members = [etcd_db.Member(m.name, m.member_id, m.peer_url, m.client_url) for m in etcd.members.values()]
    puts = [etcd_db.Put(b"/registry/namespaces/kube-system", b"k8s\0simulated", 2),
            *(etcd_db.Put(f"/registry/minions/{m.name}".encode(), b"k8s\0simulated", 3 + i)
              for i, m in enumerate(members))]
    return etcd_db.snapshot(members, puts, term=etcd.raft_term, consistent_index=etcd.raft_index)


class EtcdSnapshotService(_Base):
    def __mapping__(self) -> dict[str, Handler]:
        return {ETCD_SNAPSHOT_PATH: Handler(self.EtcdSnapshot, Cardinality.UNARY_STREAM, EtcdSnapshotRequest,
                                            common_pb2.Data)}

    async def EtcdSnapshot(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        node: SimNode
        node, _ = self.target(stream, SNAPSHOT_ROLES)
        _control_plane(node, "etcd snapshot")
        member = self.cluster.etcd.members.get(node.name)
        if member is None or not member.running:
            raise GRPCError(Status.UNKNOWN, "failed to create etcd client: etcd is not running on this node")
        source = self.cluster.etcd_snapshot_source
        data = await source() if source is not None else simulated_snapshot(self.cluster)
        self.cluster.history.record("etcd_snapshot", node.name, size=len(data))
        for i in range(0, len(data), CHUNK):
            await stream.send_message(common_pb2.Data(bytes=data[i:i + CHUNK]))
