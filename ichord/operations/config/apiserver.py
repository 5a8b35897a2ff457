"""The APIServerRestart class on one control plane (docs/decisions.md#apiserver-restart): no reboot, no drain, no etcd
check.

    no marker, converged                  -> done without a call
    no marker                             -> dry run; marker (machine, running kube-apiserver container ID,
                                             appliedAt) written; then NO_REBOOT apply
    marker, node not on the render        -> apply again (killed between marker and apply)
    marker, container changed (or unchanged for apiserver_restart_unchanged), static pod Ready, /readyz 200
                                          -> done, marker cleared (no container ID reported: no instance, waited
                                             for: managed/apiserver_restart.py)
    marker, past apiserver_restart_bound  -> APIServerNotReady: pause naming the node; the retry waits again
                                             with a fresh clock
    any read failure while marked         -> waiting (ichord may run behind the API server restarting)

The marker lives in ``status.apiServerRestart`` {machine, containerID, appliedAt, done}. Ready means the
kube-apiserver static pod Ready (Talos StaticPodStatus) and the node's own ``/readyz`` on
``localAPIServerPort`` answering 200, verified against the cluster's Kubernetes CA (the same probe as the
ca-rotation's: managed/readyz.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ichord.api.names import ReadyReason
from ichord.api.views import MachineView
from ichord.failpoints import failpoint
from ichord.kube import crds
from ichord.kube.status import update_status
from ichord.operations.config.world import World
from ichord.operations.managed import apiserver_restart
from ichord.operations.managed.readyz import node_host, readyz
from ichord.operations.managed.rendered import runs_render
from ichord.operations.outcome import Blocked, Requeue
from ichord.operations.roll_store import format_time, parse_time
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import ApplyMode
from ichord.talos.errors import TalosError

SECTION = "apiServerRestart"
Obj = dict[str, Any]


@dataclass(frozen=True)
class RestartMarker:
    machine: str = ""
    container_id: str = ""
    applied_at: dt.datetime | None = None
    done: tuple[str, ...] = ()

    @classmethod
    def of(cls, status: Obj) -> RestartMarker:
        s = status.get(SECTION) or {}
        at = s.get("appliedAt")
        return cls(str(s.get("machine") or ""), str(s.get("containerID") or ""),
                   parse_time(str(at), f"status.{SECTION}.appliedAt") if at else None,
                   tuple(str(x) for x in s.get("done") or ()))


@dataclass(frozen=True)
class RestartOutcome:
    outcome: Requeue | Blocked
    reason: str
    message: str
    pause: bool = False


async def _write(world: World, marker: RestartMarker) -> None:
    inputs = world.inputs

    def mutate(status: Obj, _obj: Obj) -> Obj:
        status[SECTION] = {"machine": marker.machine or None, "containerID": marker.container_id or None,
                           "appliedAt": format_time(marker.applied_at) if marker.applied_at else None,
                           "done": list(marker.done)}
        return status

    obj = await update_status(crds.operations(world.ctx.kube), inputs.op_namespace, inputs.name, mutate)
    inputs.op = obj
    world.ctx.observe(obj)


async def advance_restart(world: World, m: MachineView) -> RestartOutcome:
    timing = world.ctx.timing
    marker = RestartMarker.of(world.inputs.status)
    rendered = world.rendered(m)
    contract = world.inputs.cluster_inputs.contract
    now = world.now()
    if marker.machine != m.name:
        try:
            converged = await runs_render(world.talos, m.address, rendered)
            if converged:
                await _write(world, RestartMarker(done=(*marker.done, m.name)))
                return RestartOutcome(Requeue(0.0, "converged"), ReadyReason.CONVERGED,
                                      f"{m.name} already runs the rendered configuration; nothing done")
            await world.talos.apply_configuration(m.address, rendered.wire_bytes(), ApplyMode.NO_REBOOT, dry_run=True,
                                                  contract=contract)
            container = (await apiserver_restart.running_apiserver(world.talos, m.address)).container_id
        except TalosError as exc:
            message = f"cannot prepare {m.name}'s API server restart: {SCRUBBER.exception(exc)}"
            return RestartOutcome(Blocked("NodeUnreachable", message, timing.retry), "NodeUnreachable", message)
        failpoint("config.apiserver.marker.before")
        await _write(world, RestartMarker(m.name, container, now, marker.done))
        failpoint("config.apiserver.marker.after")
        try:
            await world.talos.apply_configuration(m.address, rendered.wire_bytes(), ApplyMode.NO_REBOOT,
                                                  contract=contract)
        except TalosError as exc:
            # The marker stays: the next step applies again (or waits, if it did land).
            message = f"applying {m.name}'s configuration: {SCRUBBER.exception(exc)}; trying again"
            return RestartOutcome(Requeue(timing.reboot_poll, ReadyReason.API_SERVER_RESTARTING),
                                  ReadyReason.API_SERVER_RESTARTING, message)
        failpoint("config.apiserver.apply.after")
        return RestartOutcome(Requeue(min(timing.reboot_poll, timing.apiserver_restart_unchanged), "applied"),
                              ReadyReason.API_SERVER_RESTARTING,
                              f"applied {m.name}'s configuration; waiting for kube-apiserver "
                              f"to restart (was {marker_text(container)})")
    since = marker.applied_at or now
    spent = (now - since).total_seconds()
    waiting = ""
    try:
        if not await runs_render(world.talos, m.address, rendered):
            await world.talos.apply_configuration(m.address, rendered.wire_bytes(), ApplyMode.NO_REBOOT,
                                                  contract=contract)
            waiting = "applied again (the last apply did not land)"
        else:
            running = await apiserver_restart.running_apiserver(world.talos, m.address)
            ready = running.ready
            # An empty container ID is no instance: waited for, never taken as the restart.
            restarted = apiserver_restart.restarted(marker.container_id, running.container_id, elapsed=spent,
                                                    unchanged_after=timing.apiserver_restart_unchanged)
            problem = None
            if restarted and ready:
                # The amendment's test: the node's own /readyz answers 200, anonymously, verified against the
                # cluster's Kubernetes CA (the static pod's Ready is the kubelet's view only).
                problem = await readyz(node_host(m.address), world.inputs.cluster_inputs.local_api_server_port,
                                       [world.inputs.bundle.k8s.cert_pem])
            if restarted and ready and problem is None:
                failpoint("config.apiserver.done.before")
                await _write(world, RestartMarker(done=(*marker.done, m.name)))
                return RestartOutcome(Requeue(0.0, "restarted"), "APIServerRestarted",
                                      f"kube-apiserver on {m.name} restarted and is ready")
            waiting = ("kube-apiserver has not restarted yet" if not restarted else
                       "kube-apiserver is not ready yet" if not ready else f"kube-apiserver {problem}")
    except TalosError as exc:
        waiting = f"cannot read {m.name} ({SCRUBBER.exception(exc)})"
    if spent >= timing.apiserver_restart_bound:
        # The retry waits again with a fresh clock (docs/decisions.md#config-rollout as the amendment cites it).
        await _write(world, RestartMarker(marker.machine, marker.container_id, now, marker.done))
        message = (f"kube-apiserver on {m.name} did not answer ready within {timing.apiserver_restart_bound:g} s "
                   f"({waiting}); waiting again")
        return RestartOutcome(Blocked("APIServerNotReady", message, timing.retry), "APIServerNotReady", message,
                              pause=True)
    return RestartOutcome(Requeue(min(timing.reboot_poll, timing.apiserver_restart_bound - spent), "waiting"),
                          ReadyReason.API_SERVER_RESTARTING, f"waiting for {m.name}: {waiting}")


def marker_text(container: str) -> str:
    return container or "no container reported"
