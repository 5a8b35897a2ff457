"""What the ``config`` executor asks of a node before and after it changes it (ADR 0080 D3 steps 1-3, 6).

- converged: the node already runs the rendered configuration (the rollout touches nothing there);
- Node Ready, read live from the managed cluster;
- not held by the ``upgrade-hold`` annotation;
- the dry run of the rendered configuration is accepted;
- etcd, for a control plane: every approved control plane is a member, every member's etcd answers healthy
  and no alarm is raised (a reboot takes one member down; with another missing, quorum would be lost). A
  small gate of this package's own; the etcd CA target has its own, to be unified later.
- after the reboot: the new boot runs the rendered configuration (else the machine fails for good).
"""

from __future__ import annotations

from collections.abc import Sequence

from ichord.api.views import MachineView
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError
from ichord.kube.reads import node_ready, read_node
from ichord.operations.roll_state import OPEN, GateResult, closed, failed
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.talos.client import ApplyMode, TalosClient
from ichord.talos.errors import TalosError


async def runs_rendered(talos: TalosClient, endpoint: str, rendered: MachineConfig, *,
                        persistent: bool = False) -> bool:
    """The node's active (``persistent``: on-disk, what the next boot runs) configuration equals the render
    (TalosErrors propagate: the caller decides)."""
    try:
        return MachineConfig.plain_of(await talos.machine_config(endpoint, persistent=persistent)) == rendered.plain()
    except ConfigParseError:
        return False


async def node_is_ready(kc: KubeClient, node: str) -> GateResult:
    try:
        obj = await read_node(kc, node)
    except KubeError as exc:
        return closed(f"cannot read Node {node}: {SCRUBBER.exception(exc)}")
    return OPEN if node_ready(obj) else closed(f"Node {node} is not Ready")


def not_held(machine: str, annotations: dict[str, str], hold_annotation: str) -> GateResult:
    if hold_annotation in annotations:
        return closed(f"TalosMachine {machine} carries {hold_annotation}: the rollout waits here until it is removed")
    return OPEN


async def dry_run(talos: TalosClient, endpoint: str, rendered: MachineConfig, machine: str) -> GateResult:
    try:
        await talos.apply_configuration(endpoint, rendered.to_bytes(), ApplyMode.STAGED, dry_run=True)
    except TalosError as exc:
        return closed(f"the dry run of {machine}'s configuration was refused: {SCRUBBER.exception(exc)}")
    return OPEN


async def etcd_healthy(talos: TalosClient, control_planes: Sequence[MachineView]) -> GateResult:
    """Every approved control plane in etcd, each member answering without errors, no alarm."""
    if not control_planes:
        return OPEN
    errors: list[str] = []
    members: list[str] = []
    for cp in control_planes:
        try:
            if not members:
                members = [str(m.hostname) for m in await talos.etcd_member_list(cp.address)]
            status = await talos.etcd_status(cp.address)
            alarms = await talos.etcd_alarms(cp.address)
        except TalosError as exc:
            errors.append(f"{cp.name}: {SCRUBBER.exception(exc)}")
            continue
        if status.errors:
            errors.append(f"{cp.name}: {'; '.join(status.errors)}")
        if alarms:
            errors.append(f"{cp.name}: alarm {', '.join(str(a.alarm) for a in alarms)}")
    if errors:
        return closed("etcd is not healthy on every control plane (" + "; ".join(errors) + ")")
    if len(members) < len(control_planes):
        return closed(f"etcd lists {len(members)} member(s) ({', '.join(members)}) for {len(control_planes)} "
                      "approved control planes")
    return OPEN


async def back_on_render(talos: TalosClient, endpoint: str, rendered: MachineConfig, machine: str) -> GateResult:
    """After a new boot: the render runs, or the machine fails for good (a staged config that did not take)."""
    try:
        ok = await runs_rendered(talos, endpoint, rendered)
    except TalosError as exc:
        return closed(f"cannot read {machine}'s configuration yet: {SCRUBBER.exception(exc)}")
    if ok:
        return OPEN
    return failed(f"{machine} booted again but does not run the rendered configuration")
