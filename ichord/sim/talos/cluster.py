"""A simulated Talos cluster: nodes on loopback addresses, one etcd, one history.

Each node listens on its own address (127.0.0.x, port 50000 by default) or on its own port, with
the TLS its running configuration calls for. Workers get their apid certificate from "trustd", that
is, signed by the issuing OS CA a control plane currently runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ichord.contract import V1_14, VersionContract
from ichord.render.config import MachineConfig
from ichord.sim.talos import cosi
from ichord.sim.talos.config_view import CAView
from ichord.sim.talos.etcd import EtcdCluster
from ichord.sim.talos.etcd_snapshot import EtcdSnapshotService, SnapshotSource
from ichord.sim.talos.history import History
from ichord.sim.talos.node import SimNode, Timings
from ichord.sim.talos.server import NodeServer
from ichord.sim.talos.services import MachineService, StateService
from ichord.sim.talos.tls import NodeTLS, ServingIdentityError, check_client_certificate

VERSION_TAGS = {(1, 13): "v1.13.9", (1, 14): "v1.14.5"}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    config: MachineConfig
    ip: str = "127.0.0.1"
    port: int = 0  # 0: any free port


class SimCluster:
    def __init__(self, contract: VersionContract = V1_14, timings: Timings | None = None) -> None:
        self.contract = contract
        self.timings = timings or Timings()
        self.history = History()
        self.etcd = EtcdCluster(self.history)
        self.nodes: dict[str, SimNode] = {}
        self._servers: dict[str, NodeServer] = {}
        self._tls: dict[str, NodeTLS] = {}
        self._ports: dict[str, int] = {}
        #: The API server URL the Kubeconfig RPC names; None: the configuration's cluster endpoint.
        self.kubeconfig_server: str | None = None
        #: What EtcdSnapshot streams (etcd_snapshot.py); None: a database written from the simulated etcd.
        self.etcd_snapshot_source: SnapshotSource | None = None

    def retime(self, node: str, **overrides: float) -> None:
        """Give one node durations of its own (a slow reboot, an apply latency): the fields of ``Timings``, in the
        simulated seconds every other delay is in. Takes effect from the node's next step."""
        self.nodes[node].timings = replace(self.nodes[node].timings, **overrides)

    def version_tag(self, contract: VersionContract) -> str:
        return VERSION_TAGS.get((contract.major, contract.minor), f"{contract}.0")

    async def start(self, specs: Sequence[NodeSpec]) -> None:
        for spec in specs:
            node = SimNode(self, spec.name, spec.ip, spec.port, spec.config, self.contract, self.timings)
            self.nodes[spec.name] = node
            self._tls[spec.name] = NodeTLS([spec.ip], [spec.name], self._trustd)
        # Control planes first: workers need one to sign their apid certificate.
        for node in sorted(self.nodes.values(), key=lambda n: not n.is_control_plane):
            await node.start()

    def warm(self) -> None:
        """What a real node holds before anyone asks: its apid serving certificate and its configuration's
        bytes. Both are otherwise made at the first connection and the first Get, which put a fleet's start-up
        work on the simulator's CPU while a daemon converges (bench_idle)."""
        for name, node in self.nodes.items():
            with contextlib.suppress(ServingIdentityError):  # made at the first handshake instead, as before
                self._tls[name].context(node.view)
            cosi.encoded_config(node, node.running)

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.close()
            await self.unlisten(node)

    async def __aenter__(self) -> SimCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def find(self, name: str) -> SimNode | None:
        for node in self.nodes.values():
            if name in (node.name, node.ip, node.nodename, node.endpoint):
                return node
        return None

    def _trustd(self) -> CAView | None:
        for node in self.nodes.values():
            if node.is_control_plane and node.up and node.view.os_ca.key_pem is not None:
                return node.view.os_ca
        return None

    # ---- listeners --------------------------------------------------------------------------

    async def listen(self, node: SimNode) -> None:
        if node.name in self._servers:
            return
        tls = self._tls[node.name]

        def context() -> Any:
            return tls.context(node.view)[0]

        def refused(peer: str, reason: str) -> None:
            self.history.record("handshake_refused", node.name, peer=peer, reason=reason,
                                config_hash=node.running.hash())

        server = NodeServer([MachineService(self, node), StateService(self, node),
                             EtcdSnapshotService(self, node)], context,
                            check_client_certificate, refused)
        await server.listen(node.ip, self._ports.get(node.name, node.port))
        self._ports[node.name] = node.port = server.port
        self._servers[node.name] = server

    async def unlisten(self, node: SimNode) -> None:
        server = self._servers.pop(node.name, None)
        if server is not None:
            await server.shutdown()

    def tls_state(self, node: SimNode) -> dict[str, Any]:
        try:
            return self._tls[node.name].context(node.view)[1]
        except Exception as exc:  # a worker without a control plane to sign for it
            return {"error": str(exc)}

    def state(self) -> dict[str, Any]:
        return {
            "version": str(self.contract),
            "nodes": {name: {**n.state(), "tls": self.tls_state(n)} for name, n in self.nodes.items()},
            "etcd": self.etcd.state(),
            "history": self.history.events,
        }
