"""The managed cluster's Kubernetes API, read live through the admin kubeconfig a Talos node issues.

There is no standing credential for the managed cluster (docs/decisions.md#aggregator-ca): each check asks a
control plane for a fresh admin kubeconfig (signed by its issuing Kubernetes CA) and trusts the Kubernetes CAs
it is given (a ca-rotation gives every CA of the rotation, so the serving-CA switch of Issuing cannot fail the
read). ``ManagedClients`` keeps one such client per cluster in memory for the length of an operation (a config
rollout steps many times a minute); it is replaced when the credentials change and dropped when it fails.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from ichord.api.views import MachineView
from ichord.errors import IchordError
from ichord.kube.client import KubeClient, from_kubeconfig_data
from ichord.kube.errors import KubeError
from ichord.pki import pem as _pem
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError


class NodeWatch(Protocol):
    """A watch of the managed cluster's Nodes that wakes the cluster's actor (watchers/managed_nodes.py)."""

    async def close(self) -> None: ...


#: Starts a NodeWatch through the given client (the actor composes it: ClusterScope.watch_nodes).
NodeWatcher = Callable[[KubeClient], NodeWatch]


class ManagedAPIError(IchordError):
    """The managed cluster's API cannot be reached or read; the operation waits (Blocked)."""


async def _issue(talos: TalosClient, control_planes: Sequence[MachineView], trusted: Sequence[bytes]) -> KubeClient:
    """A client from the first control plane that issues an admin kubeconfig; trust = ``trusted`` CAs."""
    errors = []
    raw: bytes | None = None
    for cp in control_planes:
        try:
            raw = await talos.kubeconfig(cp.address)
            break
        except TalosError as exc:
            errors.append(f"{cp.name}: {SCRUBBER.exception(exc)}")
    if raw is None:
        raise ManagedAPIError("no control plane issued an admin kubeconfig (" + "; ".join(errors) + ")")
    trust = [block for ca in trusted for block in _pem.pem_blocks(ca)]
    try:
        # From memory: the cluster-admin key of the managed cluster is never written anywhere (issue 14).
        return await from_kubeconfig_data(raw, what="the admin kubeconfig a Talos node issued",
                                          trust=lambda: trust, namespace="kube-system")
    except KubeError as exc:
        raise ManagedAPIError(f"the admin kubeconfig cannot be used: {SCRUBBER.exception(exc)}") from None


@contextlib.asynccontextmanager
async def admin_client(talos: TalosClient, control_planes: Sequence[MachineView],
                       trusted: Sequence[bytes]) -> AsyncIterator[KubeClient]:
    """A client of its own (closed on exit) from the first control plane that issues an admin kubeconfig."""
    client = await _issue(talos, control_planes, trusted)
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def cluster_client(clients: ManagedClients | None, key: str, talos: TalosClient,
                         control_planes: Sequence[MachineView], trusted: Sequence[bytes],
                         *, issued_in: str) -> AsyncIterator[KubeClient]:
    """The cluster ``key``'s client from ``clients`` when the caller keeps them across steps, else one of its own
    (``admin_client``: a step driven on its own, e.g. by a test). ``issued_in``: see ``ManagedClients.client``."""
    if clients is None:
        async with admin_client(talos, control_planes, trusted) as kc:
            yield kc
    else:
        async with clients.client(key, talos, control_planes, trusted, issued_in=issued_in) as kc:
            yield kc


def credentials_fingerprint(talos: TalosClient, control_planes: Sequence[MachineView],
                            trusted: Sequence[bytes], issued_in: str = "") -> str:
    """What an admin client was issued with (public parts only): the Talos credentials, who issued, the trust, and
    ``issued_in`` (what decides the CA the node signs the kubeconfig with)."""
    h = hashlib.sha256(talos.dial.fingerprint.encode())
    h.update(b"\0" + issued_in.encode())
    for cp in control_planes:
        h.update(b"\0" + cp.address.encode())
    for ca in trusted:
        h.update(b"\0" + ca)
    return h.hexdigest()


@dataclass
class _Held:
    fingerprint: str
    client: KubeClient
    #: The cluster's Nodes watched through ``client`` once a step waits on one (``watch_nodes``), closed with it.
    nodes: NodeWatch | None = None


class ManagedClients:
    """One admin client per cluster kept across steps, so a long operation does not ask a control plane for a
    kubeconfig (a Kubeconfig RPC, a TLS set-up) on every step.

    The client is replaced when what it was issued with changes (credentials_fingerprint), dropped when a use
    raises or leaves its requests failing (the next use asks for a new kubeconfig), and closed by ``close``
    when the operation ends. The cluster-admin key stays in memory only, as with ``admin_client``.
    """

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._talos: dict[str, TalosClient] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._held

    @contextlib.asynccontextmanager
    async def client(self, key: str, talos: TalosClient, control_planes: Sequence[MachineView],
                     trusted: Sequence[bytes], *, issued_in: str = "") -> AsyncIterator[KubeClient]:
        """The cluster ``key``'s client, issued now only when none is held for these credentials.

        ``issued_in`` names what else decides which CA the control plane signs the admin certificate with: a
        ca-rotation passes its stage, as the same dial and trust serve Accepting to Dropping while the API server
        stops accepting the old CA's certificates at Dropping (a client kept from Accepting is refused there)."""
        fingerprint = credentials_fingerprint(talos, control_planes, trusted, issued_in)
        held = self._held.get(key)
        if held is not None and held.fingerprint != fingerprint:
            await self.close(key)
            held = None
        if held is None:
            held = _Held(fingerprint, await _issue(talos, control_planes, trusted))
            self._held[key] = held
        try:
            yield held.client
        except BaseException:
            await self._drop(key, held)
            raise
        if held.client.reachability.failing_since is not None:
            await self._drop(key, held)

    def talos(self, key: str, dial: DialBundle, factory: Callable[[DialBundle], TalosClient]) -> TalosClient:
        """The cluster ``key``'s Talos client, kept across steps like its admin client: its minted client certificate
        and its channels to the nodes (a step of twenty workers dialled twenty TLS connections, every step). Other
        credentials close its channels (TalosClient.set_dial); ``close`` closes it."""
        held = self._talos.get(key)
        if held is None:
            held = self._talos[key] = factory(dial)
        else:
            held.set_dial(dial)
        return held

    def watch_nodes(self, key: str, watcher: NodeWatcher | None) -> None:
        """From now until the cluster's client goes, its Nodes are watched by ``watcher`` (a Node back from its
        reboot wakes the actor: watchers/managed_nodes.py). Inside ``client``'s block: through the client held."""
        held = self._held.get(key)
        if held is not None and held.nodes is None and watcher is not None:
            held.nodes = watcher(held.client)

    async def close(self, key: str) -> None:
        """The operation ended (or its credentials changed): its client goes."""
        held = self._held.pop(key, None)
        if held is not None:
            await self._close(held)
        talos = self._talos.pop(key, None)
        if talos is not None:
            talos.close()

    async def close_all(self) -> None:
        for key in list(self._held) + list(self._talos):
            await self.close(key)

    async def _drop(self, key: str, held: _Held) -> None:
        if self._held.get(key) is held:
            del self._held[key]
        await self._close(held)

    @staticmethod
    async def _close(held: _Held) -> None:
        with anyio.CancelScope(shield=True):  # a cancelled step still closes the sockets it held
            if held.nodes is not None:
                await held.nodes.close()
            await held.client.close()
