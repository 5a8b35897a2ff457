"""What the reboot roll talks to: the marker's store, two Talos calls, the managed cluster's Nodes.

Protocols, so the roll is tested on the simulators through the real adapters below and the backbone
can bring its own store (TalosOperation status) or a managed-cluster client built per step.
"""

from __future__ import annotations

from typing import Protocol

from ichord.contract import VersionContract
from ichord.kube import nodes as kube_nodes
from ichord.kube.client import KubeClient
from ichord.kube.nodes import NodeView
from ichord.operations.roll_state import RollMarker, RollTarget
from ichord.talos.client import TalosClient

#: MachineStatus stages of a node on its way down (Talos's API definitions).
STOPPING_STAGES = frozenset({"MACHINE_STAGE_REBOOTING", "MACHINE_STAGE_SHUTTING_DOWN"})


class MarkerStore(Protocol):
    """Where the roll's marker lives (the backbone: TalosOperation status; see roll_store.py)."""

    async def read(self) -> RollMarker: ...

    async def write(self, marker: RollMarker) -> None:
        """Replace the record; raise an IchordError when it was not written (the step fails, nothing follows)."""


class RollTalos(Protocol):
    """The two Talos calls of a roll. Errors are TalosErrors."""

    async def boot_id(self, target: RollTarget) -> str: ...

    async def reboot(self, target: RollTarget) -> None: ...

    async def shutting_down(self, target: RollTarget) -> bool:
        """True while the node reports itself rebooting or shutting down (still on its old boot)."""


class ManagedNodes(Protocol):
    """The managed cluster's Nodes. Errors are IchordErrors (KubeError; NotFound for a missing Node)."""

    async def read(self, name: str) -> NodeView: ...

    async def cordon(self, name: str) -> NodeView:
        """The Node as the cordon left it (the server's answer)."""
        ...

    async def uncordon(self, name: str) -> bool: ...


class TalosNodes:
    """RollTalos over a TalosClient: the BootID resource on v1.14, the boot_id file before."""

    def __init__(self, client: TalosClient, contract: VersionContract) -> None:
        self._client = client
        self._contract = contract

    async def boot_id(self, target: RollTarget) -> str:
        return await self._client.boot_id(target.endpoint, self._contract)

    async def reboot(self, target: RollTarget) -> None:
        try:
            await self._client.reboot(target.endpoint)
        finally:
            self._client.forget(target.endpoint)  # its connection ends with this boot (the client may be kept)

    async def shutting_down(self, target: RollTarget) -> bool:
        return (await self._client.machine_status(target.endpoint)).stage in STOPPING_STAGES


class KubeNodes:
    """ManagedNodes over a client of the managed cluster (ichord.kube.nodes), made for one step: the Node is read
    live once, the first time the step asks, and that copy (or what a patch of it returned) answers the rest of the
    step: its gates, its cordon and uncordon (sent with the copy's resourceVersion: a 409 reads it again once), its
    drain. Never kept across steps: a copy older than the step must not decide a reboot (ichord/kube/nodes.py)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self._held: dict[str, NodeView] = {}

    async def read(self, name: str) -> NodeView:
        if name not in self._held:
            self._held[name] = await kube_nodes.read_node_view(self._client, name)
        return self._held[name]

    async def cordon(self, name: str) -> NodeView:
        self._held[name] = await kube_nodes.cordon(self._client, name, self._held.get(name))
        return self._held[name]

    async def uncordon(self, name: str) -> bool:
        after = await kube_nodes.release(self._client, name, self._held.get(name))
        if after is not None:
            self._held[name] = after
        return after is not None

    def forget(self, name: str) -> None:
        """The Node was written by another way this step (the drain's annotation): the next ask reads it again."""
        self._held.pop(name, None)
