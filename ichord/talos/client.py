"""TalosClient: the one way ichord talks to a Talos node (gRPC over mutual TLS, grpclib).

One node per call: either a direct connection to the node's endpoint, or ``node`` metadata that
asks the endpoint's apid to proxy one-to-one (never the deprecated ``nodes`` fan-out). Channels
are cached per endpoint and credentials; when a dial bundle changes, the old channels are closed.
The dial has its own timeout (15 s) separate from each RPC's deadline (2 min).
"""

from __future__ import annotations

import asyncio
import enum
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import empty_pb2
from grpclib.client import Channel, UnaryStreamMethod
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ichord.contract import ContractMismatchError, VersionContract, runs_contract
from ichord.errors import network_cause, verify_reason
from ichord.metrics import TALOS_RPC_DURATION
from ichord.talos import errors as e
from ichord.talos.dial import DialBundle
from ichord.talos.proto.gen.common import common_pb2
from ichord.talos.proto.gen.cosi import state_grpc, state_pb2
from ichord.talos.proto.gen.machine import machine_grpc
from ichord.talos.proto.gen.machine import machine_pb2 as m
from ichord.talos.proto.gen.machine.etcd_snapshot_pb2 import EtcdSnapshotRequest
from ichord.talos.resources import ResourceReads

APID_PORT = 50000
DIAL_TIMEOUT = 15.0
RPC_TIMEOUT = 120.0
#: An etcd snapshot streams the whole database (up to etcd's 8 GiB quota): its own deadline.
SNAPSHOT_TIMEOUT = 900.0
#: MachineService.EtcdSnapshot, bound here: its request lives in its own proto file (etcd_snapshot.proto).
ETCD_SNAPSHOT_PATH = "/machine.MachineService/EtcdSnapshot"

T = TypeVar("T")

_STATUS_ERRORS: dict[Status, type[e.TalosError]] = {
    Status.UNAUTHENTICATED: e.TalosCertificateError,
    Status.PERMISSION_DENIED: e.TalosPermissionDeniedError,
    Status.FAILED_PRECONDITION: e.TalosFailedPreconditionError,
    Status.UNIMPLEMENTED: e.TalosUnimplementedError,
    Status.INVALID_ARGUMENT: e.TalosInvalidArgumentError,
    Status.NOT_FOUND: e.TalosNotFoundError,
    Status.DEADLINE_EXCEEDED: e.TalosDeadlineError,
    Status.UNAVAILABLE: e.TalosUnreachableError,
}

#: TLS alerts a node sends when it refuses the client certificate.
_CERT_ALERTS = ("ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_UNKNOWN",
                "ALERT_UNSUPPORTED_CERTIFICATE", "CERTIFICATE_REQUIRED", "ALERT_CERTIFICATE_EXPIRED",
                "ALERT_HANDSHAKE_FAILURE", "ALERT_DECRYPT_ERROR", "ALERT_ACCESS_DENIED")


class ApplyMode(enum.IntEnum):
    """ApplyConfigurationRequest.Mode. There is no default: 0 (REBOOT) is refused by v1.14 nodes."""

    REBOOT = m.ApplyConfigurationRequest.REBOOT
    AUTO = m.ApplyConfigurationRequest.AUTO
    NO_REBOOT = m.ApplyConfigurationRequest.NO_REBOOT
    STAGED = m.ApplyConfigurationRequest.STAGED
    TRY = m.ApplyConfigurationRequest.TRY


def split_endpoint(endpoint: str, default_port: int = APID_PORT) -> tuple[str, int]:
    """``10.0.0.1``, ``10.0.0.1:50000``, ``[fd00::1]:50000``, ``node.example`` -> (host, port)."""
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if endpoint.count(":") == 1:
        host, port = endpoint.split(":")
        return host, int(port)
    return endpoint, default_port


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be dialled as it is written, or None: checked before a dial, so a bad address is said
    as such (TalosInvalidEndpointError) rather than failing deep in the socket layer with an untyped error."""
    if not endpoint.strip():
        return "the address is empty"
    if endpoint.startswith("[") and "]" not in endpoint:
        return f"{endpoint!r} opens a bracket it does not close"
    if "/" in endpoint or any(c.isspace() for c in endpoint):
        return f"{endpoint!r} is not a host: no scheme, path or spaces"
    try:
        host, port = split_endpoint(endpoint)
    except ValueError:
        return f"the port of {endpoint!r} is not a number"
    if not host:
        return f"{endpoint!r} names no host"
    if not 0 < port < 65536:
        return f"the port of {endpoint!r} is outside 1-65535"
    return None


@dataclass(frozen=True)
class ApplyResult:
    mode: int  # machine_pb2.ApplyConfigurationRequest.Mode actually used
    mode_details: str
    warnings: tuple[str, ...]

    @property
    def mode_name(self) -> str:
        return m.ApplyConfigurationRequest.Mode.Name(self.mode)  # type: ignore[arg-type]


@dataclass(frozen=True)
class VersionInfo:
    tag: str
    sha: str
    arch: str
    platform: str


class _CachedChannel:
    def __init__(self, channel: Channel, fingerprint: str) -> None:
        self.channel = channel
        self.fingerprint = fingerprint
        self.answered = False
        #: The connection (grpclib's protocol) the channel last connected on, and the node's Version read on it.
        #: An apply sent on a connection reaches the boot that connection was made to (a rebooted or upgraded
        #: node's new kernel resets the old connection), so a Version read on it is that boot's.
        self.connection: object | None = None
        self.version: VersionInfo | None = None

    def connected(self, connection: object) -> None:
        if connection is not self.connection:
            self.connection, self.version = connection, None


class TalosClient(ResourceReads):
    """Talos API calls with typed errors. Use ``async with`` or call ``close()``."""

    def __init__(self, dial: DialBundle, *, port: int = APID_PORT, dial_timeout: float = DIAL_TIMEOUT,
                 rpc_timeout: float = RPC_TIMEOUT, server_name: str | None = None) -> None:
        self._dial = dial
        self._port = port
        self._dial_timeout = dial_timeout
        self._rpc_timeout = rpc_timeout
        self._server_name = server_name
        self._channels: dict[tuple[str, int], _CachedChannel] = {}
        self._ssl: tuple[str, ssl.SSLContext] | None = None  # (dial fingerprint, its context)

    async def __aenter__(self) -> TalosClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    @property
    def dial(self) -> DialBundle:
        return self._dial

    def set_dial(self, dial: DialBundle) -> None:
        """Use other credentials from now on; channels dialled with the old ones are closed."""
        if dial.fingerprint != self._dial.fingerprint:
            self._dial = dial
            self.close()

    def close(self) -> None:
        for cached in self._channels.values():
            cached.channel.close()
        self._channels.clear()

    # ---- channels ---------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        """One context (one minted client certificate) per credentials for all of this client's channels:
        minting and loading one per node was the largest cost of converging a fleet (bench_idle's profile)."""
        fingerprint = self._dial.fingerprint
        if self._ssl is None or self._ssl[0] != fingerprint:
            self._ssl = (fingerprint, self._dial.ssl_context())
        return self._ssl[1]

    def _channel(self, endpoint: str) -> _CachedChannel:
        host, port = split_endpoint(endpoint, self._port)
        key = (host, port)
        cached = self._channels.get(key)
        if cached is not None and cached.fingerprint != self._dial.fingerprint:
            cached.channel.close()
            cached = None
        if cached is None:
            config = Configuration(ssl_target_name_override=self._server_name) if self._server_name else None
            cached = _CachedChannel(Channel(host, port, ssl=self._ssl_context(), config=config),
                                    self._dial.fingerprint)
            self._channels[key] = cached
        return cached

    def forget(self, endpoint: str) -> None:
        """Close the channel to ``endpoint`` (the node was asked to reboot): the next call dials afresh, within the
        dial timeout, rather than waiting out an RPC deadline on a connection the node may have dropped silently."""
        self._drop(endpoint)

    def _drop(self, endpoint: str) -> None:
        cached = self._channels.pop(split_endpoint(endpoint, self._port), None)
        if cached is not None:
            cached.channel.close()

    async def _connect(self, endpoint: str, method: str, node: str | None) -> Channel:
        problem = endpoint_problem(endpoint)
        if problem is not None:
            raise e.TalosInvalidEndpointError(endpoint, method, problem, node=node)
        cached = self._channel(endpoint)
        try:
            # asyncio.timeout, not wait_for: this runs before every call, and wait_for costs a task each time.
            async with asyncio.timeout(self._dial_timeout):
                cached.connected(await cached.channel.__connect__())
        except BaseException as exc:
            self._drop(endpoint)
            raise self._translate(exc, endpoint, method, node, dialing=True) from None
        return cached.channel

    def _translate(self, exc: BaseException, endpoint: str, method: str, node: str | None,
                   *, dialing: bool = False, fresh: bool = False) -> BaseException:
        """Map a failure to a typed error. ``fresh``: no call has succeeded on this connection yet."""
        if isinstance(exc, e.TalosError):
            return exc
        if isinstance(exc, GRPCError):
            cls = _STATUS_ERRORS.get(exc.status, e.TalosRPCError)
            return cls(endpoint, method, exc.message or exc.status.name, code=exc.status.name, node=node)
        if isinstance(exc, ssl.SSLCertVerificationError):
            return e.TalosCertificateError(
                endpoint, method, f"the node's serving certificate is not trusted: {verify_reason(exc)}", node=node)
        if isinstance(exc, ssl.SSLError):
            reason = exc.reason or str(exc)
            if any(alert in reason for alert in _CERT_ALERTS):
                return e.TalosCertificateError(
                    endpoint, method, f"the node refused the TLS handshake ({reason})", node=node)
            return e.TalosCertificateError(endpoint, method, f"TLS failed ({reason})", node=node)
        if isinstance(exc, TimeoutError):
            if dialing:
                return e.TalosUnreachableError(endpoint, method, f"no connection within {self._dial_timeout:g} s",
                                               node=node)
            return e.TalosDeadlineError(endpoint, method, f"no answer within {self._rpc_timeout:g} s",
                                        code="DEADLINE_EXCEEDED", node=node)
        if not dialing and fresh and isinstance(exc, StreamTerminatedError | ConnectionError):
            # With TLS 1.3 a node refuses the client certificate after the client considers the
            # handshake done: the first call on the connection then finds it closed.
            return e.TalosCertificateError(
                endpoint, method, "the node closed the connection right after the TLS handshake"
                f" ({network_cause(exc)}); it refused the client certificate", node=node)
        if isinstance(exc, StreamTerminatedError):
            return e.TalosUnreachableError(endpoint, method, f"connection lost ({network_cause(exc)})", node=node)
        if isinstance(exc, OSError):
            # "connection refused", "name not resolved (...)": never asyncio's "Connect call failed ('a', p)"
            return e.TalosUnreachableError(endpoint, method, network_cause(exc), node=node)
        return exc

    def _metadata(self, node: str | None) -> dict[str, str] | None:
        return {"node": node} if node else None

    async def _call(self, endpoint: str, method: str, node: str | None,
                    fn: Callable[[Channel], Awaitable[T]]) -> T:
        start, code = time.monotonic(), "Unavailable"
        try:
            channel = await self._connect(endpoint, method, node)
            cached = self._channels.get(split_endpoint(endpoint, self._port))
            fresh = cached is None or not cached.answered
            try:
                result = await fn(channel)
            except GRPCError as exc:
                code = exc.status.name.title().replace("_", "")
                if cached is not None:
                    cached.answered = True  # the node answered: the connection itself is fine
                raise self._translate(exc, endpoint, method, node) from None
            except (TimeoutError, ssl.SSLError, StreamTerminatedError, OSError) as exc:
                code = "DeadlineExceeded" if isinstance(exc, TimeoutError) else "Unavailable"
                self._drop(endpoint)
                raise self._translate(exc, endpoint, method, node, fresh=fresh) from None
            code = "OK"
            if cached is not None:
                cached.answered = True
            return result
        finally:
            TALOS_RPC_DURATION.labels(method=method, code=code).observe(time.monotonic() - start)

    async def _unary(self, endpoint: str, method: str, node: str | None, request: Any) -> Any:
        async def run(channel: Channel) -> Any:
            stub = machine_grpc.MachineServiceStub(channel)
            rpc = getattr(stub, method)
            response = await rpc(request, timeout=self._rpc_timeout, metadata=self._metadata(node))
            if not response.messages:
                raise e.TalosProtocolError(endpoint, method, "the response holds no message", node=node)
            return response.messages[0]
        return await self._call(endpoint, method, node, run)

    async def _stream_bytes(self, endpoint: str, method: str, node: str | None, request: Any) -> bytes:
        async def run(channel: Channel) -> bytes:
            stub = machine_grpc.MachineServiceStub(channel)
            rpc = getattr(stub, method)
            chunks: list[bytes] = []
            async with rpc.open(timeout=self._rpc_timeout, metadata=self._metadata(node)) as stream:
                await stream.send_message(request, end=True)
                async for data in stream:
                    chunks.append(data.bytes)
            return b"".join(chunks)
        return await self._call(endpoint, method, node, run)

    # ---- machine.MachineService -------------------------------------------------------------

    async def version(self, endpoint: str, *, node: str | None = None) -> VersionInfo:
        msg = await self._unary(endpoint, "Version", node, empty_pb2.Empty())
        info = VersionInfo(msg.version.tag, msg.version.sha, msg.version.arch, msg.platform.name)
        cached = self._channels.get(split_endpoint(endpoint, self._port))
        if cached is not None and node is None:  # a proxied node may reboot under the endpoint's connection
            cached.version = info
        return info

    async def running_version(self, endpoint: str, *, node: str | None = None) -> VersionInfo:
        """The node's Version as read on the connection now open to it: read once per connection (so once per boot
        at most), or again when proxied to ``node``."""
        await self._connect(endpoint, "Version", node)
        cached = self._channels.get(split_endpoint(endpoint, self._port))
        if node is None and cached is not None and cached.version is not None:
            return cached.version
        return await self.version(endpoint, node=node)

    async def check_contract(self, endpoint: str, contract: VersionContract, *, node: str | None = None) -> None:
        """ContractMismatchError unless the node runs ``contract`` (docs/decisions.md#contract-match)."""
        tag = (await self.running_version(endpoint, node=node)).tag
        if not runs_contract(tag, contract):
            raise ContractMismatchError(endpoint, contract, tag, node=node)

    async def apply_configuration(self, endpoint: str, data: bytes, mode: int, *, contract: VersionContract,
                                  dry_run: bool = False, node: str | None = None) -> ApplyResult:
        """Apply a whole configuration rendered for ``contract``, and only to a node that runs it: the node's
        running version is checked first (ContractMismatchError, nothing sent). ``mode`` is always explicit (the
        proto default 0 means REBOOT)."""
        await self.check_contract(endpoint, contract, node=node)
        request = m.ApplyConfigurationRequest(data=data, mode=mode, dry_run=dry_run)  # type: ignore[arg-type]
        msg = await self._unary(endpoint, "ApplyConfiguration", node, request)
        return ApplyResult(int(msg.mode), msg.mode_details, tuple(msg.warnings))

    async def reboot(self, endpoint: str, *, mode: int = m.RebootRequest.DEFAULT, node: str | None = None) -> str:
        """Ask for a reboot; returns the actor ID of the reboot."""
        msg = await self._unary(endpoint, "Reboot", node, m.RebootRequest(mode=mode))  # type: ignore[arg-type]
        return str(msg.actor_id)

    async def etcd_member_list(self, endpoint: str, *, query_local: bool = False,
                               node: str | None = None) -> list[m.EtcdMember]:
        msg = await self._unary(endpoint, "EtcdMemberList", node, m.EtcdMemberListRequest(query_local=query_local))
        return list(msg.members)

    async def etcd_status(self, endpoint: str, *, node: str | None = None) -> m.EtcdMemberStatus:
        msg = await self._unary(endpoint, "EtcdStatus", node, empty_pb2.Empty())
        status: m.EtcdMemberStatus = msg.member_status
        return status

    async def etcd_alarms(self, endpoint: str, *, node: str | None = None) -> list[m.EtcdMemberAlarm]:
        msg = await self._unary(endpoint, "EtcdAlarmList", node, empty_pb2.Empty())
        return list(msg.member_alarms)

    async def etcd_forfeit_leadership(self, endpoint: str, *, node: str | None = None) -> str:
        """Returns the member that received leadership ("" if this node was not the leader)."""
        msg = await self._unary(endpoint, "EtcdForfeitLeadership", node, m.EtcdForfeitLeadershipRequest())
        return str(msg.member)

    async def service_list(self, endpoint: str, *, node: str | None = None) -> list[m.ServiceInfo]:
        msg = await self._unary(endpoint, "ServiceList", node, empty_pb2.Empty())
        return list(msg.services)

    async def service_restart(self, endpoint: str, service: str, *, node: str | None = None) -> str:
        msg = await self._unary(endpoint, "ServiceRestart", node, m.ServiceRestartRequest(id=service))
        return str(msg.resp)

    async def read(self, endpoint: str, path: str, *, node: str | None = None) -> bytes:
        return await self._stream_bytes(endpoint, "Read", node, m.ReadRequest(path=path))

    async def kubeconfig_archive(self, endpoint: str, *, node: str | None = None) -> bytes:
        """The raw Kubeconfig stream (a gzip tar); see ``ichord.talos.resources.kubeconfig``."""
        return await self._stream_bytes(endpoint, "Kubeconfig", node, empty_pb2.Empty())

    async def etcd_snapshot(self, endpoint: str, sink: Callable[[bytes], None], *, node: str | None = None,
                            deadline: float = SNAPSHOT_TIMEOUT) -> int:
        """EtcdSnapshot (control planes; os:admin, os:operator or os:etcd:backup): etcd's database streamed chunk by
        chunk into ``sink`` as the node sends it (never held whole in memory); returns the bytes streamed."""
        async def run(channel: Channel) -> int:
            method = UnaryStreamMethod(channel, ETCD_SNAPSHOT_PATH, EtcdSnapshotRequest, common_pb2.Data)
            total = 0
            async with method.open(timeout=deadline, metadata=self._metadata(node)) as stream:
                await stream.send_message(EtcdSnapshotRequest(), end=True)
                async for data in stream:
                    sink(data.bytes)
                    total += len(data.bytes)
            return total
        return await self._call(endpoint, "EtcdSnapshot", node, run)

    # ---- cosi.resource.State ----------------------------------------------------------------

    async def cosi_get(self, endpoint: str, namespace: str, rtype: str, rid: str, *,
                       node: str | None = None) -> Any:
        async def run(channel: Channel) -> Any:
            stub = state_grpc.StateStub(channel)
            response = await stub.Get(state_pb2.GetRequest(namespace=namespace, type=rtype, id=rid),
                                      timeout=self._rpc_timeout, metadata=self._metadata(node))
            return response.resource
        return await self._call(endpoint, f"Get {rtype}/{rid}", node, run)

    async def cosi_list(self, endpoint: str, namespace: str, rtype: str, *, node: str | None = None) -> list[Any]:
        async def run(channel: Channel) -> list[Any]:
            stub = state_grpc.StateStub(channel)
            out = []
            async with stub.List.open(timeout=self._rpc_timeout, metadata=self._metadata(node)) as stream:
                await stream.send_message(state_pb2.ListRequest(namespace=namespace, type=rtype), end=True)
                async for item in stream:
                    out.append(item.resource)
            return out
        return await self._call(endpoint, f"List {rtype}", node, run)

    async def cosi_watch(self, endpoint: str, namespace: str, rtype: str, rid: str | None = None, *,
                         node: str | None = None, deadline: float | None = None) -> AsyncIterator[Any]:
        """Events of a kind (its contents first, then BOOTSTRAPPED) or of one resource (its current state first:
        CREATED, or DESTROYED when it does not exist). The caller stops iterating when done.

        Talos refuses bootstrap contents on a watch of one ID (COSI: Unimplemented): that watch starts with
        the resource anyway, so the option is only sent for a kind."""
        channel = await self._connect(endpoint, "Watch", node)
        stub = state_grpc.StateStub(channel)
        request = state_pb2.WatchRequest(namespace=namespace, type=rtype, api_version=1,
                                         options=state_pb2.WatchOptions(bootstrap_contents=rid is None))
        if rid is not None:
            request.id = rid
        try:
            async with stub.Watch.open(timeout=deadline or self._rpc_timeout,
                                       metadata=self._metadata(node)) as stream:
                await stream.send_message(request, end=True)
                async for response in stream:
                    for event in response.event:
                        yield event
        except (GRPCError, TimeoutError, ssl.SSLError, StreamTerminatedError, OSError) as exc:
            raise self._translate(exc, endpoint, f"Watch {rtype}", node) from None
