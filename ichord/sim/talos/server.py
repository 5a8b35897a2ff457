"""A grpclib server whose TLS handshake is done per connection, so it can follow a changing config.

The listener accepts plain TCP; each connection is upgraded with ``loop.start_tls`` using the
context the node's running configuration calls for at that moment. A refused handshake (client
certificate from a CA the node does not accept, no certificate, wrong ExtKeyUsage) is recorded with
OpenSSL's reason, and the connection is closed, as apid closes it. Accepted connections are handed
to grpclib's HTTP/2 protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable, Collection
from typing import Any

from google.protobuf import empty_pb2
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

#: Returns the server context for a new connection, or raises to refuse it.
ContextFor = Callable[[], ssl.SSLContext]
#: Checks the verified client leaf (DER); returns why it is refused, or None.
PeerCheck = Callable[[bytes | None], str | None]
#: Records a refused handshake: (peer address, reason).
Refused = Callable[[str, str], None]

HANDSHAKE_TIMEOUT = 10.0
#: The longest a refused connection stays open after its alert (see _linger).
ALERT_LINGER = 5.0


class _Connection(asyncio.Protocol):
    def __init__(self, server: NodeServer) -> None:
        self.server = server
        self.raw: asyncio.Transport | None = None
        self.tls: asyncio.BaseTransport | None = None
        self.h2: Any = None
        self.pending: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        transport.pause_reading()  # nothing is read until start_tls takes over
        self.server._connections.add(self)
        self.server._spawn(self._handshake())

    async def _handshake(self) -> None:
        assert self.raw is not None
        peer = self.raw.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        loop = asyncio.get_running_loop()
        try:
            ctx = self.server.context_for()
            starting = loop.create_task(loop.start_tls(self.raw, self, ctx, server_side=True,
                                                       ssl_handshake_timeout=HANDSHAKE_TIMEOUT))
            await asyncio.sleep(0)  # start_tls has put its TLS protocol on the transport
            _send_alerts(self.raw.get_protocol())
            tls = await starting
        except (ssl.SSLError, OSError, ConnectionError) as exc:
            reason = getattr(exc, "verify_message", None) or str(exc) or type(exc).__name__
            self.server.refused(where, f"TLS handshake failed: {reason}")
            self._abort()
            return
        except Exception as exc:  # a configuration that cannot serve (e.g. no issuing CA)
            self.server.refused(where, f"cannot serve TLS: {exc}")
            self._abort()
            return
        if tls is None:
            self._abort()
            return
        self.tls = tls
        ssl_object = tls.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        why = self.server.peer_check(der)
        if why is not None:
            self.server.refused(where, why)
            tls.abort()
            self.closed = True
            return
        self.h2 = self.server._protocol_factory()
        self.h2.connection_made(tls)
        for data in self.pending:
            self.h2.data_received(data)
        self.pending.clear()

    def _abort(self) -> None:
        self.closed = True
        if self.raw is not None:
            self.raw.abort()

    def data_received(self, data: bytes) -> None:
        if self.h2 is not None:
            self.h2.data_received(data)
        elif not self.closed:
            self.pending.append(data)

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        if self.h2 is not None:
            self.h2.pause_writing()

    def resume_writing(self) -> None:
        if self.h2 is not None:
            self.h2.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if self.h2 is not None:
            self.h2.connection_lost(exc)

    def abort(self) -> None:
        if self.tls is not None:
            self.tls.abort()  # type: ignore[attr-defined]
        self._abort()


#: The services of the Talos API (apid and machined); a method of theirs the simulator lacks is one it cannot
#: reproduce, anything else is a service Talos does not have.
TALOS_SERVICES = frozenset({"machine.MachineService", "cluster.ClusterService", "inspect.InspectService",
                            "storage.StorageService", "time.TimeService", "cosi.resource.State"})


class _Unserved(dict[str, Handler]):
    """The method table, answering every path it lacks with a handler that refuses it properly: grpclib's own
    refusal omits the content-type, which Talos's Go client reports as Unknown "malformed header"."""

    def get(self, path: str, default: Any = None) -> Handler:
        found = super().get(path)
        if found is not None:
            return found
        service = path.lstrip("/").partition("/")[0]

        async def refuse(stream: Stream[Any, Any]) -> None:
            if service in TALOS_SERVICES:
                raise GRPCError(Status.UNIMPLEMENTED,
                                f"{path} is not simulated: ichord sim talos cannot reproduce this Talos method")
            # grpc-go's answers (apid proxies what it does not know to machined, whose server has no such thing)
            raise GRPCError(Status.UNIMPLEMENTED, f"unknown service {service}")

        return Handler(refuse, Cardinality.UNARY_UNARY, empty_pb2.Empty, empty_pb2.Empty)


def _send_alerts(protocol: Any) -> None:
    """Make asyncio's TLS layer send the alert OpenSSL wrote when it refused a handshake (a client certificate
    it does not trust, an expired one, one not for client use) before it closes the connection, as apid's TLS
    stack does: asyncio drops it, and the client reads a bare EOF, which looks like a network fault. The alert
    waits in the protocol's outgoing buffer (asyncio's private ``_outgoing``; the simulator accepts that
    coupling, as it does grpclib's ``_method_name``)."""
    complete = getattr(protocol, "_on_handshake_complete", None)
    outgoing = getattr(protocol, "_outgoing", None)
    if complete is None or not isinstance(outgoing, ssl.MemoryBIO):
        return

    def on_handshake_complete(exc: BaseException | None) -> None:
        transport = getattr(protocol, "_transport", None)  # set once the protocol is connected
        if exc is not None and transport is not None and not transport.is_closing():
            alert = outgoing.read()
            if alert:
                transport.write(alert)  # an empty write buffer: sent now, before the close
                _linger(transport)
        complete(exc)

    protocol._on_handshake_complete = on_handshake_complete


def _linger(transport: asyncio.BaseTransport) -> None:
    """Keep a refused connection's socket open (on a duplicate of its descriptor, asyncio closes its own) with
    its write side shut after the alert, reading and dropping what the client still sends until it closes or
    ``ALERT_LINGER`` passes: closing a socket the client still writes to resets it, and the reset overtakes
    the alert (the client's HTTP/2 preface and first request follow its TLS 1.3 Finished at once)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return
    loop = asyncio.get_running_loop()
    kept = socket.socket(fileno=os.dup(sock.fileno()))
    kept.setblocking(False)
    fd = kept.fileno()

    def close() -> None:
        loop.remove_reader(fd)
        kept.close()

    def drain() -> None:
        try:
            if not kept.recv(65536):
                close()
        except BlockingIOError:
            pass
        except OSError:
            close()

    with contextlib.suppress(OSError):
        kept.shutdown(socket.SHUT_WR)
    loop.add_reader(fd, drain)
    loop.call_later(ALERT_LINGER, lambda: None if kept.fileno() < 0 else close())


class NodeServer(Server):
    """grpclib Server listening with a per-connection TLS gate."""

    def __init__(self, handlers: Collection[Any], context_for: ContextFor, peer_check: PeerCheck,
                 refused: Refused) -> None:
        super().__init__(handlers)
        self._mapping = _Unserved(self._mapping)
        self.context_for = context_for
        self.peer_check = peer_check
        self.refused = refused
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def listen(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_address=True)
        self._server_closed_fut = loop.create_future()

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = self._server.sockets  # type: ignore[attr-defined]
        return int(sockets[0].getsockname()[1])

    async def shutdown(self) -> None:
        """Stop listening and drop every connection (the node went away)."""
        if self._server is None:
            return
        self.close()
        for conn in list(self._connections):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_closed(), 2.0)
