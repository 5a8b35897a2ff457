"""The gRPC services of a simulated node: machine.MachineService and cosi.resource.State.

Authorisation is apid's: roles come from the client certificate's Organization; each method has
its allowed roles (machined.go); etcd calls and Kubeconfig run on control planes only. ``node``
metadata proxies the call one-to-one to another node of the simulated cluster.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ichord.sim.talos import cosi
from ichord.sim.talos.kubeconfig import admin_kubeconfig, archive
from ichord.talos.proto.gen.common import common_pb2
from ichord.talos.proto.gen.cosi import state_grpc, state_pb2
from ichord.talos.proto.gen.machine import machine_grpc
from ichord.talos.proto.gen.machine import machine_pb2 as m

if TYPE_CHECKING:
    from ichord.sim.talos.cluster import SimCluster
    from ichord.sim.talos.node import SimNode

ADMIN = frozenset({"os:admin"})
OPERATOR = ADMIN | {"os:operator"}
READER = OPERATOR | {"os:reader"}
ETCD_READ = READER | {"os:etcd:backup"}
CHUNK = 4096


def _roles(stream: Stream[Any, Any]) -> tuple[str, ...]:
    """Roles are the verified client certificate's Organization values, as apid reads them."""
    cert = stream.peer.cert() or {}
    return tuple(value for rdn in cert.get("subject", ()) for key, value in rdn if key == "organizationName")


class _Base:
    one_to_many_refused = False

    def __init__(self, cluster: SimCluster, node: SimNode) -> None:
        self.cluster = cluster
        self.node = node

    def target(self, stream: Stream[Any, Any], allowed: frozenset[str]) -> tuple[SimNode, tuple[str, ...]]:
        roles = _roles(stream)
        if not allowed & set(roles):
            raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
        md = stream.metadata
        values = [v.decode() if isinstance(v, bytes) else v for v in md.getall("node")] if md and "node" in md else []
        if md and "nodes" in md:
            if self.one_to_many_refused:  # apid refuses it for /cosi.resource.State/
                raise GRPCError(Status.INVALID_ARGUMENT, "one-to-many proxying is not supported for this method")
            raise GRPCError(Status.UNIMPLEMENTED, "one-to-many proxying (nodes metadata) is not simulated")
        if len(values) > 1:
            raise GRPCError(Status.INVALID_ARGUMENT, "only one node can be specified with node metadata")
        node = self.node
        if values:
            found = self.cluster.find(values[0])
            if found is None:
                raise GRPCError(Status.UNAVAILABLE, f"connection error: dial tcp {values[0]}:50000: no such host")
            node = found
            if not node.up:
                raise GRPCError(Status.UNAVAILABLE,
                                f"connection error: dial tcp {node.endpoint}: connect: connection refused")
        # grpclib keeps the request's :path only privately; the simulator's counter accepts that coupling.
        node.rpcs[str(getattr(stream, "_method_name", "/?")).rsplit("/", 1)[-1]] += 1
        return node, roles

    async def unary(self, stream: Stream[Any, Any], allowed: frozenset[str],
                    fn: Callable[[SimNode, Any, tuple[str, ...]], Awaitable[Any]]) -> None:
        request = await stream.recv_message()
        node, roles = self.target(stream, allowed)
        if node.faults.slow:
            await asyncio.sleep(node.faults.slow)
        await stream.send_message(await fn(node, request, roles))

    async def stream_bytes(self, stream: Stream[Any, Any], data: bytes) -> None:
        for i in range(0, max(len(data), 1), CHUNK):
            await stream.send_message(common_pb2.Data(bytes=data[i:i + CHUNK]))


def _control_plane(node: SimNode, api: str) -> None:
    if not node.is_control_plane:
        raise GRPCError(Status.UNIMPLEMENTED, f"{api} is only available on control plane nodes")


class MachineService(_Base, machine_grpc.MachineServiceBase):
    async def ApplyConfiguration(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.ApplyConfigurationRequest, roles: tuple[str, ...]) -> Any:
            timeout = req.try_mode_timeout.ToTimedelta().total_seconds() if req.HasField("try_mode_timeout") else None
            if req.dry_run:  # counted apart from the applies (target() counted it as one)
                node.rpcs["ApplyConfiguration"] -= 1
                node.rpcs["ApplyConfiguration(dry run)"] += 1
            mode, details = await node.apply(req.data, int(req.mode), req.dry_run, timeout)
            return m.ApplyConfigurationResponse(messages=[m.ApplyConfiguration(
                mode=mode, mode_details=details)])  # type: ignore[arg-type]
        await self.unary(stream, ADMIN, run)

    async def Reboot(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.RebootRequest, roles: tuple[str, ...]) -> Any:
            node.refuse_reboot()
            actor = str(uuid.uuid4())
            node.request_reboot(actor)
            return m.RebootResponse(messages=[m.Reboot(actor_id=actor)])
        await self.unary(stream, OPERATOR, run)

    async def Version(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            tag = node.cluster.version_tag(node.contract)
            return m.VersionResponse(messages=[m.Version(
                version=m.VersionInfo(tag=tag, sha="simulated", built="", go_version="go1.25", os="linux",
                                      arch="amd64"),
                platform=m.PlatformInfo(name="metal", mode="metal"), features=m.FeaturesInfo(rbac=True))])
        await self.unary(stream, READER, run)

    def _etcd_member(self, node: SimNode, api: str) -> Any:
        _control_plane(node, api)
        member = self.cluster.etcd.members.get(node.name)
        if member is None or not member.running:
            # machined wraps the etcd client error with fmt.Errorf: the status is Unknown.
            raise GRPCError(Status.UNKNOWN, "failed to create etcd client: etcd is not running on this node")
        return member

    async def EtcdMemberList(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.EtcdMemberListRequest, roles: tuple[str, ...]) -> Any:
            self._etcd_member(node, "member list")
            etcd = self.cluster.etcd
            if not etcd.healthy(node.name) if req.query_local else not etcd.has_quorum:
                # WithRequireLeader: etcd's own status error passes through unchanged.
                raise GRPCError(Status.UNAVAILABLE, "etcdserver: no leader")
            members = [m.EtcdMember(id=x.member_id, hostname=x.name, peer_urls=[x.peer_url],
                                    client_urls=[x.client_url]) for x in etcd.members.values()]
            return m.EtcdMemberListResponse(messages=[m.EtcdMembers(
                legacy_members=[x.hostname for x in members], members=members)])
        await self.unary(stream, ETCD_READ, run)

    async def EtcdForfeitLeadership(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            self._etcd_member(node, "etcd forfeit leadership")
            if len(self.cluster.etcd.members) < 2:
                raise GRPCError(Status.UNKNOWN, "failed to forfeit leadership: the cluster has only one member")
            return m.EtcdForfeitLeadershipResponse(messages=[m.EtcdForfeitLeadership(
                member=self.cluster.etcd.forfeit(node.name))])
        await self.unary(stream, ADMIN, run)

    async def EtcdAlarmList(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            member = self._etcd_member(node, "etcd alarm list")
            alarms = [m.EtcdMemberAlarm(member_id=member.member_id, alarm=a) for a in member.alarms]
            return m.EtcdAlarmListResponse(messages=[m.EtcdAlarm(member_alarms=alarms)])
        await self.unary(stream, ETCD_READ, run)

    async def EtcdStatus(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            member = self._etcd_member(node, "etcd status")
            etcd = self.cluster.etcd
            leader = etcd.members[etcd.leader].member_id if etcd.leader else 0
            errors = [] if etcd.healthy(node.name) else ["etcdserver: no leader", *etcd.peer_errors(node.name)]
            status = m.EtcdMemberStatus(protocol_version="3.6.0", db_size=4 << 20, db_size_in_use=2 << 20,
                                        leader=leader, raft_index=etcd.raft_index, raft_term=etcd.raft_term,
                                        raft_applied_index=etcd.raft_index, errors=errors,
                                        member_id=member.member_id, storage_version="3.6.0")
            return m.EtcdStatusResponse(messages=[m.EtcdStatus(member_status=status)])
        await self.unary(stream, ETCD_READ, run)

    async def ServiceList(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            infos = [m.ServiceInfo(id=s.id, state=s.state,
                                   health=m.ServiceHealth(healthy=node.service_healthy(s.id), unknown=False))
                     for s in node.services.values()]
            return m.ServiceListResponse(messages=[m.ServiceList(services=infos)])
        await self.unary(stream, READER, run)

    async def ServiceRestart(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.ServiceRestartRequest, roles: tuple[str, ...]) -> Any:
            if req.id not in node.services:
                raise GRPCError(Status.NOT_FOUND, f"service {req.id!r} not found")
            node.restart_service(req.id)
            return m.ServiceRestartResponse(messages=[m.ServiceRestart(resp=f'Service "{req.id}" restarted')])
        await self.unary(stream, OPERATOR, run)

    async def Kubeconfig(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        node, _ = self.target(stream, ADMIN)
        _control_plane(node, "kubeconfig")
        try:
            data = archive(admin_kubeconfig(node.view, node.cluster.kubeconfig_server))
        except LookupError as exc:
            raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
        await self.stream_bytes(stream, data)

    async def Read(self, stream: Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        assert req is not None
        node, _ = self.target(stream, ADMIN)
        files = {"/proc/sys/kernel/random/boot_id": (node.boot_id + "\n").encode()}
        if node.is_control_plane and node.view.etcd_ca is not None:
            files["/system/secrets/etcd/ca.crt"] = node.view.etcd_ca.cert_pem
        if req.path not in files:
            raise GRPCError(Status.NOT_FOUND, f"open {req.path}: no such file or directory")
        await self.stream_bytes(stream, files[req.path])


class StateService(_Base, state_grpc.StateBase):
    one_to_many_refused = True
    async def Get(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: state_pb2.GetRequest, roles: tuple[str, ...]) -> Any:
            t = cosi.resolve(node, req.namespace, req.type, roles)
            res = cosi.build(node, t, req.namespace, req.id)
            if res is None:
                raise cosi.not_found(t, req.namespace, req.id)
            return state_pb2.GetResponse(resource=res)
        await self.unary(stream, READER, run)

    async def List(self, stream: Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        assert req is not None
        node, roles = self.target(stream, READER)
        t = cosi.resolve(node, req.namespace, req.type, roles)
        for rid in t.ids(node):
            res = cosi.build(node, t, req.namespace, rid)
            if res is not None:
                await stream.send_message(state_pb2.ListResponse(resource=res))

    async def Watch(self, stream: Stream[Any, Any]) -> None:
        req = await stream.recv_message()
        assert req is not None
        node, roles = self.target(stream, READER)
        t = cosi.resolve(node, req.namespace, req.type, roles)
        want = req.id if req.HasField("id") else None
        queue = node.subscribe()
        try:
            if req.options.bootstrap_contents:
                events = [state_pb2.Event(resource=r, event_type=state_pb2.CREATED)
                          for rid in t.ids(node) if want in (None, rid)
                          for r in [cosi.build(node, t, req.namespace, rid)] if r is not None]
                if req.api_version >= 1:
                    events.append(state_pb2.Event(event_type=state_pb2.BOOTSTRAPPED))
                await stream.send_message(state_pb2.WatchResponse(event=events))
            last: dict[str, Any] = {}
            while True:
                kind, namespace, rtype, rid = await queue.get()
                if rtype != t.type or namespace != req.namespace or want not in (None, rid):
                    continue
                res = cosi.build(node, t, namespace, rid)
                if kind == "DESTROYED" or res is None:
                    old = last.pop(rid, None)
                    stub = old or state_pb2.Event().resource
                    if old is None:
                        stub.metadata.namespace, stub.metadata.type, stub.metadata.id = namespace, rtype, rid
                    await stream.send_message(state_pb2.WatchResponse(event=[state_pb2.Event(
                        resource=stub, event_type=state_pb2.DESTROYED)]))
                    continue
                event_type = state_pb2.CREATED if kind == "CREATED" else state_pb2.UPDATED
                last[rid] = res
                await stream.send_message(state_pb2.WatchResponse(event=[state_pb2.Event(
                    resource=res, event_type=event_type)]))
        finally:
            node.unsubscribe(queue)

