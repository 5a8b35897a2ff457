"""What one step of the ``config`` executor works with: the machines, their renders, the Talos and managed clients.

Built fresh every step from what the operation step read; only the managed-cluster client is kept between steps
(a connection, no state: a restarted daemon resumes from the operation's status, the Nodes and the nodes).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ichord.api.views import MachineView
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError
from ichord.kube.reads import list_nodes
from ichord.operations.managed.context import StepContext
from ichord.operations.managed.inputs import Inputs
from ichord.operations.managed.rendered import render_of
from ichord.operations.roll_state import RollTarget
from ichord.operations.roll_store import MarkerFields
from ichord.render.config import MachineConfig
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosError

Obj = dict[str, Any]

#: The reboot roll's marker lives in status.roll (the CRD): machine, its boot ID, when, the ones done.
ROLL_FIELDS = MarkerFields(section="roll", rebooting="rebooting", boot_id="rebootBootID",
                           requested_at="requestedAt", done="done", staged_at="stagedAt")


class NodeNameUnknown(Exception):
    """No name could be found for a machine's Node (no hostname, Talos silent, no Node with its address)."""


@dataclass
class World:
    ctx: StepContext
    inputs: Inputs
    talos: TalosClient
    managed: KubeClient
    #: Approved machines' TalosMachine objects by name (labels and annotations, which MachineView drops).
    objects: dict[str, Obj]
    _renders: dict[str, MachineConfig] = field(default_factory=dict)

    def now(self) -> dt.datetime:
        return self.ctx.now()

    def machine(self, name: str) -> MachineView | None:
        return next((m for m in self.inputs.machines if m.name == name), None)

    @property
    def control_planes(self) -> list[MachineView]:
        return self.inputs.control_planes

    def rendered(self, m: MachineView) -> MachineConfig:
        if m.name not in self._renders:
            self._renders[m.name] = render_of(self.inputs, m)
        return self._renders[m.name]

    def annotations(self, name: str) -> dict[str, str]:
        return dict(((self.objects.get(name) or {}).get("metadata") or {}).get("annotations") or {})

    async def node_name(self, m: MachineView) -> str:
        """spec.hostname, else Talos's Nodename (the reconciler's record, or asked), else the Node whose address matches
        (docs/decisions.md#config-rollout: a missing hostname must not stop a rollout)."""
        if m.hostname:
            return m.hostname
        if m.status.get("nodeName"):  # Talos's Nodename, as the machine reconciler last read it
            return str(m.status["nodeName"])
        try:
            return await self.talos.nodename(m.address)
        except TalosError:
            pass
        host = m.address.rsplit(":", 1)[0] if m.address.count(":") == 1 else m.address
        try:
            for node in await list_nodes(self.managed):
                if any(a.get("address") == host for a in (node.get("status") or {}).get("addresses") or []):
                    return str(node["metadata"]["name"])
        except KubeError:
            pass
        raise NodeNameUnknown(f"cannot tell the Node of {m.name}: no spec.hostname, its Talos API does not answer "
                              "and no Node has its address")

    async def target(self, m: MachineView) -> RollTarget:
        return RollTarget(m.name, m.address, await self.node_name(m))
