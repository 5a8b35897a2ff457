"""Each control plane's own kube-apiserver ``/readyz`` (docs/decisions.md#config-rollout's API-server-restart
amendment).

A real control plane serves its local API server on ``<node IP>:<localAPIServerPort>``; anonymous ``/readyz``
answers 200 only while that node's kube-apiserver runs and is ready. The simulated managed API is one server
behind the endpoint; this module gives every other control plane a small HTTPS server of its own, serving a
certificate of the node's current issuing Kubernetes CA (chosen per handshake, so a CA change needs no
restart). The control plane whose address:port is the endpoint's is answered by the managed API server itself
(``KubeSimulator.readyz``). Faults per node: ``"500"`` (the check fails) and ``"hang"`` (no answer).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from aiohttp import web

from ichord.pki.ca import CertificateAuthority
from ichord.sim.kube.certs import issue_serving_certificate, server_ssl_context
from ichord.sim.kube.server import KubeSimulator
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.node import SimNode


def node_ready(node: SimNode) -> bool:
    return node.up and node.apiserver_ready


class ReadyzServers:
    def __init__(self, talos: SimCluster, kube: KubeSimulator, port: int) -> None:
        self.talos = talos
        self.kube = kube
        self.port = port
        #: node name -> "500" or "hang" (unset: the real answer).
        self.faults: dict[str, str] = {}
        #: Every answer given: (node name, status) in order; "refused" when the node was down.
        self.answers: list[tuple[str, str]] = []
        self._runners: list[web.AppRunner] = []
        self._contexts: dict[tuple[str, bytes], ssl.SSLContext] = {}

    async def start(self) -> None:
        for node in self.talos.nodes.values():
            if not node.is_control_plane:
                continue
            if (node.ip, self.port) == (self.kube.settings.host, self.kube.port):
                self.kube.readyz = self._answer_for(node)
                continue
            await self._serve(node)

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    def _answer_for(self, node: SimNode) -> Callable[[], int | None]:
        """The status /readyz answers now (None: do not answer)."""
        def answer() -> int | None:
            fault = self.faults.get(node.name)
            status = None if fault == "hang" else 500 if fault == "500" or not node_ready(node) else 200
            self.answers.append((node.name, str(status or "hang")))
            return status
        return answer

    def _context_for(self, node: SimNode) -> ssl.SSLContext:
        issuing = node.view.k8s_issuing
        if issuing is None or issuing.key_pem is None:
            raise ssl.SSLError("the node has no Kubernetes CA key to serve with")
        key = (node.name, issuing.signer_pem)
        ctx = self._contexts.get(key)
        if ctx is None:
            ca = CertificateAuthority(issuing.signer_pem, issuing.key_pem)
            ctx = self._contexts[key] = server_ssl_context(
                issue_serving_certificate(ca, [node.ip, "127.0.0.1"]))
        return ctx

    async def _serve(self, node: SimNode) -> None:
        answer = self._answer_for(node)

        async def readyz(request: web.Request) -> web.StreamResponse:
            if not node.up:
                if request.transport is not None:
                    request.transport.close()
                raise ConnectionResetError("the node is down")
            status = answer()
            if status is None:
                await asyncio.sleep(3600)
                status = 500
            return web.Response(status=status, text="ok" if status == 200 else "[-]poststarthook failed")

        def sni(sock: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            sock.context = self._context_for(node)

        listening = self._context_for(node)
        listening.sni_callback = sni
        app = web.Application()
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((node.ip, self.port))
        await web.SockSite(runner, sock, ssl_context=listening).start()
        self._runners.append(runner)
