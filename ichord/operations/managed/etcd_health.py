"""Is etcd whole? The check before an etcd rotation starts, and before and after every reboot of a control plane
(the etcd roll's, a config rollout's).

docs/decisions.md#etcd-reboot-roll: every control plane's etcd service Running and healthy, a leader
seen, one member per approved control plane (no more, no fewer), no alarm, kube-apiserver ready on
each. A problem is a *fault* when waiting will not clear it by itself (an alarm, a member that is not
an approved machine, a control plane missing from the member list): the caller pauses at once
instead of waiting out a bound.

RPCs per control plane: ServiceList (COSI List of services), EtcdStatus, EtcdAlarmList and the static
pod statuses; EtcdMemberList once per check (from the first control plane that answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ichord.api.views import MachineView
from ichord.operations.managed.apiserver_restart import APISERVER_POD_PREFIX
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosError
from ichord.talos.proto.gen.machine import machine_pb2 as m

ALARM_NAMES = {m.EtcdMemberAlarm.NOSPACE: "NOSPACE", m.EtcdMemberAlarm.CORRUPT: "CORRUPT"}


@dataclass(frozen=True)
class Problem:
    text: str
    fault: bool = False  # waiting alone will not clear it


async def _member_problems(talos: TalosClient, cp: MachineView) -> tuple[list[Problem], int]:
    """The control plane's own member: service, status (leader, errors), alarms, kube-apiserver. Returns its id."""
    out: list[Problem] = []
    service = (await talos.services(cp.address)).get("etcd")
    if service is None or not service.running or not service.healthy:
        state = "not running" if service is None or not service.running else "not healthy"
        out.append(Problem(f"the etcd service on {cp.name} is {state}"))
    try:
        status = await talos.etcd_status(cp.address)
    except TalosError as exc:
        return [*out, Problem(f"etcd on {cp.name} does not answer: {SCRUBBER.exception(exc)}")], 0
    if status.errors:
        out.append(Problem(f"etcd on {cp.name} reports: {status.errors[0]}"))
    if not status.leader:
        out.append(Problem(f"etcd on {cp.name} sees no leader"))
    alarms = [a for a in await talos.etcd_alarms(cp.address) if a.alarm != m.EtcdMemberAlarm.NONE]
    if alarms:
        names = ", ".join(sorted({ALARM_NAMES.get(a.alarm, str(a.alarm)) for a in alarms}))
        out.append(Problem(f"etcd on {cp.name} has the alarm {names} set; disarm it before the roll goes on",
                           fault=True))
    pods = [p for p in await talos.static_pod_statuses(cp.address) if p.id.startswith(APISERVER_POD_PREFIX)]
    if not pods or not all(p.ready for p in pods):
        out.append(Problem(f"kube-apiserver on {cp.name} is not ready"))
    return out, int(status.member_id)


async def etcd_problems(talos: TalosClient, control_planes: Sequence[MachineView]) -> list[Problem]:
    """Everything that keeps etcd from being whole now (empty: whole). Talos errors become problems."""
    problems: list[Problem] = []
    ids: dict[int, str] = {}
    for cp in control_planes:
        try:
            found, member_id = await _member_problems(talos, cp)
        except TalosError as exc:
            found, member_id = [Problem(f"control plane {cp.name} does not answer: {SCRUBBER.exception(exc)}")], 0
        problems += found
        if member_id:
            ids[member_id] = cp.name
    members = None
    for cp in control_planes:
        try:
            members = await talos.etcd_member_list(cp.address)
            break
        except TalosError:
            continue
    if members is None:
        return [*problems, Problem("no control plane lists the etcd members (no leader?)")]
    listed = {int(x.id): x for x in members}
    extra = [x.hostname or str(x.id) for i, x in sorted(listed.items()) if i not in ids]
    if ids and extra:
        problems.append(Problem(f"etcd lists member(s) that are no approved control plane: {', '.join(extra)}; "
                                "remove them (talosctl etcd remove-member) or approve their machines", fault=True))
    missing = [name for i, name in sorted(ids.items(), key=lambda kv: kv[1]) if i not in listed]
    if missing:
        problems.append(Problem(f"etcd does not list the member of {', '.join(missing)}", fault=True))
    if len(listed) != len(control_planes) and not extra and not missing:
        problems.append(Problem(f"etcd lists {len(listed)} member(s) for {len(control_planes)} approved control "
                                "plane(s)"))
    learners = [x.hostname for x in members if x.is_learner]
    if learners:
        problems.append(Problem(f"etcd member(s) still learning: {', '.join(learners)}"))
    return problems
