"""The gRPC services of a simulated node: machine.MachineService and cosi.resource.State.

Authorisation is apid's: roles come from the client certificate's Organization; each method has
its allowed roles (machined.go); etcd calls and Kubeconfig run on control planes only. ``node``
metadata proxies the call one-to-one to another node of the simulated cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
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


def _status_name(status: Status) -> str:
    """grpc-go's name of a code ("InvalidArgument"), as Talos's errors spell it."""
    return "".join(word.capitalize() for word in status.name.split("_"))


def _error_metadata(meta: common_pb2.Metadata, target: str, exc: GRPCError) -> None:
    """apid's BuildError: a node's failure inside a one-to-many answer (its hostname, error and status)."""
    meta.hostname = target
    meta.error = f"rpc error: code = {_status_name(exc.status)} desc = {exc.message or ''}"
    meta.status.code = exc.status.value
    meta.status.message = exc.message or ""


#: A node an RPC goes to: the name the client gave ("" for the endpoint itself) and the node, or why apid
#: could not reach it.
Target = tuple[str, "SimNode | GRPCError"]
#: The services apid lets fan out with ``nodes`` metadata (apid's director); any other refuses it.
ONE_TO_MANY = ("/machine.MachineService/", "/cluster.ClusterService/", "/inspect.InspectService/",
               "/storage.StorageService/", "/time.TimeService/")


class _Base:
    def __init__(self, cluster: SimCluster, node: SimNode) -> None:
        self.cluster = cluster
        self.node = node

    @staticmethod
    def method(stream: Stream[Any, Any]) -> str:
        # grpclib keeps the request's :path only privately; the simulator accepts that coupling.
        return str(getattr(stream, "_method_name", "/?"))

    def authorize(self, stream: Stream[Any, Any], allowed: frozenset[str]) -> tuple[str, ...]:
        roles = _roles(stream)
        if not allowed & set(roles):
            raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
        return roles

    def resolve(self, given: str) -> SimNode | GRPCError:
        """The node apid dials for ``given`` (port 50000 of that name or address), or the error it meets."""
        if not given or given.count(":") == 1 or given.startswith("["):  # net.AddressContainsPort
            return GRPCError(Status.INTERNAL, f"invalid target {given!r}".replace("'", '"'))
        found = self.cluster.find(given)
        dialing = 'connection error: desc = "transport: Error while dialing: dial tcp'
        if found is None:
            if _is_address(given):
                return GRPCError(Status.UNAVAILABLE, f'{dialing} {given}:50000: connect: connection refused"')
            return GRPCError(Status.UNAVAILABLE, f'{dialing}: lookup {given}: no such host"')
        if not found.up:
            return GRPCError(Status.UNAVAILABLE, f'{dialing} {found.ip}:50000: connect: connection refused"')
        return found

    def route(self, stream: Stream[Any, Any]) -> list[Target] | None:
        """apid's director: None for a call the endpoint serves itself or proxies one-to-one (``node``),
        else the targets of a one-to-many call (``nodes``)."""
        md = stream.metadata

        def values(key: str) -> list[str]:
            return [v.decode() if isinstance(v, bytes) else str(v) for v in md.getall(key)] if md and key in md else []

        nodes, node = values("nodes"), values("node")
        if node and len(node) != 1:
            raise GRPCError(Status.INVALID_ARGUMENT, "node metadata must be single-valued")
        if nodes:
            if not self.method(stream).startswith(ONE_TO_MANY):
                raise GRPCError(Status.INVALID_ARGUMENT,
                                f"one-2-many proxying is not supported for method {self.method(stream)}")
            return [(given, self.resolve(given)) for given in nodes]
        return None

    def target(self, stream: Stream[Any, Any], allowed: frozenset[str]) -> tuple[SimNode, tuple[str, ...]]:
        """The one node a one-to-one call runs on (``node`` metadata proxies it), after apid's role check."""
        roles = self.authorize(stream, allowed)
        if self.route(stream) is not None:
            raise GRPCError(Status.UNIMPLEMENTED, f"{self.method(stream)} with nodes metadata (one-to-many) is "
                                                  "not simulated")
        md = stream.metadata
        given = md.get("node") if md else None
        node: SimNode | GRPCError = self.node
        if given:
            node = self.resolve(given.decode() if isinstance(given, bytes) else str(given))
        if isinstance(node, GRPCError):
            raise node
        self.count(node, stream)
        return node, roles

    def count(self, node: SimNode, stream: Stream[Any, Any]) -> None:
        node.rpcs[self.method(stream).rsplit("/", 1)[-1]] += 1

    async def unary(self, stream: Stream[Any, Any], allowed: frozenset[str],
                    fn: Callable[[SimNode, Any, tuple[str, ...]], Awaitable[Any]], response: type[Any]) -> None:
        request = await stream.recv_message()
        roles = self.authorize(stream, allowed)
        targets = self.route(stream)
        if targets is None:
            node, roles = self.target(stream, allowed)
            if node.faults.slow:
                await asyncio.sleep(node.faults.slow)
            await stream.send_message(await fn(node, request, roles))
            return

        async def one(given: str, node: SimNode | GRPCError) -> list[Any]:
            try:
                if isinstance(node, GRPCError):
                    raise node
                self.count(node, stream)
                if node.faults.slow:
                    await asyncio.sleep(node.faults.slow)
                reply = await fn(node, request, roles)
            except GRPCError as exc:
                failed = response().messages.add()
                _error_metadata(failed.metadata, given, exc)
                return [failed]
            for message in reply.messages:
                message.metadata.hostname = given  # apid's AppendInfo
            return list(reply.messages)

        answers = await asyncio.gather(*(one(given, node) for given, node in targets))
        await stream.send_message(response(messages=[msg for part in answers for msg in part]))

    async def streamed(self, stream: Stream[Any, Any], allowed: frozenset[str],
                       fn: Callable[[SimNode, Any], AsyncIterator[Any]], message: type[Any]) -> None:
        """A server-streaming call; one-to-many: every node's messages with its hostname, a failure as one
        message carrying the error (apid's AppendInfo and BuildError for streams)."""
        request = await stream.recv_message()
        roles = self.authorize(stream, allowed)
        targets = self.route(stream)
        if targets is None:
            node, _ = self.target(stream, allowed)
            async for item in fn(node, request):
                await stream.send_message(item)
            return
        del roles
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def one(given: str, node: SimNode | GRPCError) -> None:
            try:
                if isinstance(node, GRPCError):
                    raise node
                self.count(node, stream)
                async for item in fn(node, request):
                    item.metadata.hostname = given
                    await queue.put(item)
            except GRPCError as exc:
                failed = message()
                _error_metadata(failed.metadata, given, exc)
                await queue.put(failed)

        tasks = [asyncio.ensure_future(one(given, node)) for given, node in targets]
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        getter: asyncio.Future[Any] | None = None
        try:
            while not (done.done() and queue.empty()):
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    await stream.send_message(getter.result())
                else:
                    getter.cancel()
        finally:
            # A stream closed mid-way (the handler cancelled) leaves no task pending and no gather's error unread:
            # a pending Queue.get destroyed with its event loop is an unraisable error in a later test.
            pending = [t for t in (*tasks, getter) if t is not None and not t.done()]
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([*pending, done])
            if done.done() and not done.cancelled():
                done.exception()  # read: never "exception was never retrieved"

    @staticmethod
    async def chunks(data: bytes) -> AsyncIterator[common_pb2.Data]:
        for i in range(0, max(len(data), 1), CHUNK):
            yield common_pb2.Data(bytes=data[i:i + CHUNK])


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


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
        await self.unary(stream, ADMIN, run, m.ApplyConfigurationResponse)

    async def Reboot(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.RebootRequest, roles: tuple[str, ...]) -> Any:
            node.refuse_reboot()
            actor = str(uuid.uuid4())
            node.request_reboot(actor)
            return m.RebootResponse(messages=[m.Reboot(actor_id=actor)])
        await self.unary(stream, OPERATOR, run, m.RebootResponse)

    async def Version(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            tag = node.cluster.version_tag(node.contract)
            return m.VersionResponse(messages=[m.Version(
                version=m.VersionInfo(tag=tag, sha="simulated", built="", go_version="go1.25", os="linux",
                                      arch="amd64"),
                platform=m.PlatformInfo(name="metal", mode="metal"), features=m.FeaturesInfo(rbac=True))])
        await self.unary(stream, READER, run, m.VersionResponse)

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
        await self.unary(stream, ETCD_READ, run, m.EtcdMemberListResponse)

    async def EtcdForfeitLeadership(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            self._etcd_member(node, "etcd forfeit leadership")
            if len(self.cluster.etcd.members) < 2:
                raise GRPCError(Status.UNKNOWN, "failed to forfeit leadership: the cluster has only one member")
            return m.EtcdForfeitLeadershipResponse(messages=[m.EtcdForfeitLeadership(
                member=self.cluster.etcd.forfeit(node.name))])
        await self.unary(stream, ADMIN, run, m.EtcdForfeitLeadershipResponse)

    async def EtcdAlarmList(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            member = self._etcd_member(node, "etcd alarm list")
            alarms = [m.EtcdMemberAlarm(member_id=member.member_id, alarm=a) for a in member.alarms]
            return m.EtcdAlarmListResponse(messages=[m.EtcdAlarm(member_alarms=alarms)])
        await self.unary(stream, ETCD_READ, run, m.EtcdAlarmListResponse)

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
        await self.unary(stream, ETCD_READ, run, m.EtcdStatusResponse)

    async def ServiceList(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any, roles: tuple[str, ...]) -> Any:
            infos = [m.ServiceInfo(id=s.id, state=s.state,
                                   health=m.ServiceHealth(healthy=node.service_healthy(s.id), unknown=False))
                     for s in node.services.values()]
            return m.ServiceListResponse(messages=[m.ServiceList(services=infos)])
        await self.unary(stream, READER, run, m.ServiceListResponse)

    async def ServiceRestart(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.ServiceRestartRequest, roles: tuple[str, ...]) -> Any:
            if req.id not in node.services:
                raise GRPCError(Status.NOT_FOUND, f"service {req.id!r} not found")
            node.restart_service(req.id)
            return m.ServiceRestartResponse(messages=[m.ServiceRestart(resp=f'Service "{req.id}" restarted')])
        await self.unary(stream, OPERATOR, run, m.ServiceRestartResponse)

    async def Kubeconfig(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: Any) -> AsyncIterator[common_pb2.Data]:
            _control_plane(node, "kubeconfig")
            try:
                data = archive(admin_kubeconfig(node.view, node.cluster.kubeconfig_server))
            except LookupError as exc:
                raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
            async for chunk in self.chunks(data):
                yield chunk
        await self.streamed(stream, ADMIN, run, common_pb2.Data)

    async def Read(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.ReadRequest) -> AsyncIterator[common_pb2.Data]:
            files = {"/proc/sys/kernel/random/boot_id": (node.boot_id + "\n").encode()}
            if node.is_control_plane and node.view.etcd_ca is not None:
                files["/system/secrets/etcd/ca.crt"] = node.view.etcd_ca.cert_pem
            if req.path not in files:
                raise GRPCError(Status.NOT_FOUND, f"open {req.path}: no such file or directory")
            async for chunk in self.chunks(files[req.path]):
                yield chunk
        await self.streamed(stream, ADMIN, run, common_pb2.Data)

    async def Events(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: m.EventsRequest) -> AsyncIterator[m.Event]:
            yield m.Event()  # machined's first, empty event: the watch is established
            queue = node.events.subscribe()
            try:
                for past in node.events.backlog(req.tail_events, req.tail_id, req.tail_seconds):
                    if req.with_actor_id in ("", past.actor_id):
                        yield past
                while True:
                    event = await queue.get()
                    if event is None:  # the node went down: a proxied stream breaks, as apid's backend does
                        raise GRPCError(Status.UNAVAILABLE, "error reading from server: EOF")
                    if req.with_actor_id in ("", event.actor_id):
                        yield event
            finally:
                node.events.unsubscribe(queue)
        await self.streamed(stream, READER, run, m.Event)


class StateService(_Base, state_grpc.StateBase):
    async def Get(self, stream: Stream[Any, Any]) -> None:
        async def run(node: SimNode, req: state_pb2.GetRequest, roles: tuple[str, ...]) -> Any:
            t = cosi.resolve(node, req.namespace, req.type, roles)
            res = cosi.build(node, t, req.namespace, req.id)
            if res is None:
                raise cosi.not_found(t, req.namespace, req.id)
            return state_pb2.GetResponse(resource=res)
        await self.unary(stream, READER, run, state_pb2.GetResponse)

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
        """COSI's Watch (cosi-project/runtime protobuf server over Talos's in-memory state): an empty response
        once the watch is set up, then one event per response. A watch of one ID starts with that resource
        (CREATED) or its tombstone (DESTROYED) and refuses bootstrap contents; a kind watch with bootstrap
        contents sends each resource (CREATED) and then BOOTSTRAPPED (API version 1 and later)."""
        req = await stream.recv_message()
        assert req is not None
        node, roles = self.target(stream, READER)
        t = cosi.resolve(node, req.namespace, req.type, roles)
        want = req.id if req.HasField("id") else None
        if want is not None and req.options.bootstrap_contents:
            raise GRPCError(Status.UNIMPLEMENTED, "bootstrap contents is not implemented for resource watch")
        if want is not None and len(req.options.label_query):
            raise GRPCError(Status.UNIMPLEMENTED, "label query is not implemented for resource watch")
        if req.options.tail_events or req.options.start_from_bookmark or req.options.bootstrap_bookmark:
            raise GRPCError(Status.UNIMPLEMENTED, "watch tail events and bookmarks are not simulated")
        queue = node.subscribe()

        async def send(event_type: int, resource: Any, old: Any = None) -> None:
            event = state_pb2.Event(event_type=event_type, resource=resource)  # type: ignore[arg-type]
            if old is not None:
                event.old.CopyFrom(old)
            await stream.send_message(state_pb2.WatchResponse(event=[event]))

        try:
            await stream.send_message(state_pb2.WatchResponse())  # the watch is ready
            last: dict[str, Any] = {}
            if want is not None:
                current = cosi.build(node, t, req.namespace, want)
                if current is None:
                    await send(state_pb2.DESTROYED, cosi.tombstone(req.namespace, t.type, want))
                else:
                    last[want] = current
                    await send(state_pb2.CREATED, current)
            else:
                # what the watcher starts from: sent with bootstrap contents, known to it either way (an update
                # of a resource that existed is UPDATED, its removal DESTROYED with its last state)
                for rid in t.ids(node):
                    current = cosi.build(node, t, req.namespace, rid)
                    if current is not None:
                        last[rid] = current
                        if req.options.bootstrap_contents:
                            await send(state_pb2.CREATED, current)
                if req.options.bootstrap_contents and req.api_version >= 1:
                    await send(state_pb2.BOOTSTRAPPED, cosi.tombstone(req.namespace, t.type, ""))
            while True:
                kind, namespace, rtype, rid = await queue.get()
                if kind == "DOWN":  # the node went down: a proxied watch breaks, as apid's backend does
                    raise GRPCError(Status.UNAVAILABLE, "error reading from server: EOF")
                if rtype != t.type or namespace != req.namespace or want not in (None, rid):
                    continue
                res = cosi.build(node, t, namespace, rid)
                previous = last.pop(rid, None)
                if kind == "DESTROYED" or res is None:
                    if previous is not None:  # already gone for this watcher: nothing to say
                        await send(state_pb2.DESTROYED, previous)
                    continue
                last[rid] = res
                if previous is None:
                    await send(state_pb2.CREATED, res)
                else:
                    await send(state_pb2.UPDATED, res, previous)
        finally:
            node.unsubscribe(queue)
