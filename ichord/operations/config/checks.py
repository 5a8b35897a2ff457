"""What the ``config`` executor asks of a node before and after it changes it (docs/decisions.md#config-rollout steps
1-3, 6).

- converged: the node already runs the rendered configuration (managed/rendered.py; the rollout touches nothing
  there);
- Node Ready, read live from the managed cluster (once a step: the roll's copy, roll_ports.KubeNodes);
- not held by the ``upgrade-hold`` annotation;
- the dry run of the rendered configuration is accepted;
- etcd, for a control plane, before and after its reboot: whole, by the etcd CA roll's own check
  (managed.etcd_health; a reboot takes one member down; with another missing, quorum would be lost).
- after the reboot: the new boot runs the rendered configuration (else the machine fails for good).
"""

from __future__ import annotations

from collections.abc import Sequence

from ichord.api.views import MachineView
from ichord.contract import VersionContract
from ichord.errors import IchordError
from ichord.operations.managed.etcd_health import etcd_problems
from ichord.operations.managed.rendered import runs_render
from ichord.operations.roll_ports import ManagedNodes
from ichord.operations.roll_state import OPEN, GateResult, closed, failed
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import MachineConfig
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.errors import TalosError

#: Problems named in a closed gate's message (the rest are counted).
SHOWN = 3


async def node_is_ready(nodes: ManagedNodes, node: str) -> GateResult:
    """On the Node as this step read it (the roll's own read: one GET a step, never an older copy)."""
    try:
        view = await nodes.read(node)
    except IchordError as exc:
        return closed(f"cannot read Node {node}: {SCRUBBER.exception(exc)}")
    return OPEN if view.ready else closed(f"Node {node} is not Ready")


def not_held(machine: str, annotations: dict[str, str], hold_annotation: str) -> GateResult:
    if hold_annotation in annotations:
        return closed(f"TalosMachine {machine} carries {hold_annotation}: the rollout waits here until it is removed")
    return OPEN


async def dry_run(talos: TalosClient, endpoint: str, rendered: MachineConfig, machine: str,
                  contract: VersionContract) -> GateResult:
    """Refused by Talos: the gate stays closed. A node of another contract than ``contract`` is no refusal to wait
    out: its ContractMismatchError blocks the operation (docs/decisions.md#contract-match)."""
    try:
        await talos.apply_configuration(endpoint, rendered.wire_bytes(), ApplyMode.STAGED, dry_run=True,
                                        contract=contract)
    except TalosError as exc:
        return closed(f"the dry run of {machine}'s configuration was refused: {SCRUBBER.exception(exc)}")
    return OPEN


async def etcd_whole(talos: TalosClient, control_planes: Sequence[MachineView]) -> GateResult:
    """etcd whole on every approved control plane, as the etcd CA roll asks it (managed.etcd_health): the
    service running and healthy, a leader, one member per control plane, no alarm, kube-apiserver ready.
    The problems that waiting will not clear (an alarm, a foreign or missing member) are named first."""
    problems = await etcd_problems(talos, control_planes)
    if not problems:
        return OPEN
    shown = sorted(problems, key=lambda p: not p.fault)
    text = "; ".join(p.text for p in shown[:SHOWN]) + (f" (and {len(shown) - SHOWN} more)" if len(shown) > SHOWN
                                                         else "")
    return closed(f"etcd is not whole, so no control plane reboots now: {text}")


async def back_on_render(talos: TalosClient, endpoint: str, rendered: MachineConfig, machine: str) -> GateResult:
    """After a new boot: the render runs, or the machine fails for good (a staged config that did not take)."""
    try:
        ok = await runs_render(talos, endpoint, rendered)
    except TalosError as exc:
        return closed(f"cannot read {machine}'s configuration yet: {SCRUBBER.exception(exc)}")
    if ok:
        return OPEN
    return failed(f"{machine} booted again but does not run the rendered configuration")
