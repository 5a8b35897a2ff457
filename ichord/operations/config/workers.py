"""Workers up to ``maxUnavailable`` at once (docs/decisions.md#config-rollout): one roll marker per worker.

Each worker under way has its own marker in ``status.workerRolls.<machine>`` (the roll's fields: rebooting,
rebootBootID, requestedAt, done), written before its cordon, so the set of disrupted workers is persisted
and a restarted daemon counts it against the bound. A worker whose marker says done is moved to
``status.roll.done`` and its marker removed, in one write: the roll's own "done" write does it (a marker naming
its machine done is never kept in the slot), so recording a worker done costs no round of its own. The plan's
last machine (ichord's own node when it is in the plan) is never taken here: it goes alone, after everything
else, through ``status.roll``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio

from ichord.api.views import MachineView
from ichord.kube.crds import CustomObjects
from ichord.kube.status import StatusMutation, update_status
from ichord.operations.config.plan import PlannedMachine
from ichord.operations.config.world import ROLL_FIELDS
from ichord.operations.roll_state import RollMarker
from ichord.operations.roll_store import MarkerFormatError, format_time, marker_from_status, parse_time

SLOTS = "workerRolls"
Obj = dict[str, Any]


def _marker(entry: Obj, where: str) -> RollMarker:
    at, staged = entry.get("requestedAt"), entry.get("stagedAt")
    return RollMarker(rebooting=str(entry.get("rebooting") or ""), boot_id=str(entry.get("rebootBootID") or ""),
                      requested_at=parse_time(str(at), where) if at else None,
                      done=tuple(str(x) for x in entry.get("done") or ()),
                      staged_at=parse_time(str(staged), where) if staged else None)


def _entry(marker: RollMarker, started: object = None) -> Obj:
    """A worker's slot: its marker, and ``startedAt`` (when the slot was taken) kept as it was."""
    out: Obj = {"rebooting": marker.rebooting or None, "rebootBootID": marker.boot_id or None,
                "done": list(marker.done)}
    if marker.requested_at is not None:
        out["requestedAt"] = format_time(marker.requested_at)
    if marker.staged_at is not None:
        out["stagedAt"] = format_time(marker.staged_at)
    if started:
        out["startedAt"] = started
    return out


class StatusLine:
    """The operation's status as the workers a step advances together write it: one write in flight at a time, and
    what is asked for while one is in flight goes out together in the next one (a group commit). Twenty workers
    writing their markers one after the other waited twenty round trips of a ~40 KiB status (about 30 ms each on a
    real API server, docs/scaling.md); together they wait two at most.

    A caller is back once the write that carries its mutation is answered (the marker is then durable, so its
    irreversible call may follow, docs/decisions.md#config-rollout), with the operation as that write returned it;
    when the write fails every caller it carried raises its error, and nothing is known to be written. A mutation
    that raises fails its own caller only; the mutations here build their change aside and set it last, so one that
    raises has changed nothing.

    ``obj`` is the step's own read of the operation (the informer's, never older than this process's own last write:
    docs/architecture.md#read-your-writes), then what each write returned. A marker is read from it (only the leader
    writes workers' markers) and a write starts from it: a copy gone stale costs one 409 and a fresh read
    (kube/status.py), never a lost marker."""

    def __init__(self, objects: CustomObjects, namespace: str, name: str, obj: Obj | None = None) -> None:
        self._objects, self._namespace, self._name = objects, namespace, name
        self._lock = anyio.Lock()
        self._queued: list[_Queued] = []
        self.obj = obj

    async def read(self) -> Obj:
        if self.obj is None:
            self.obj = await self._objects.get(self._namespace, self._name)
        return self.obj

    async def update(self, mutate: StatusMutation) -> Obj:
        """Apply ``mutate`` in the line's next write (kube/status.py's mutation); the operation as written."""
        mine = _Queued(mutate)
        self._queued.append(mine)
        async with self._lock:  # FIFO: whoever gets it next sends everything queued meanwhile
            if not mine.sent:
                await self._send(mine)
        if mine.error is not None:
            raise mine.error
        assert mine.written is not None
        return mine.written

    async def _send(self, mine: _Queued) -> None:
        batch, self._queued = self._queued, []

        def together(status: Obj, obj: Obj) -> Obj | None:
            changed = False
            for queued in batch:
                queued.error = None  # a conflict runs every mutation again, on a fresh read
                try:
                    new = queued.mutate(status, obj)
                except Exception as exc:  # its own caller's failure alone (e.g. its marker unreadable)
                    queued.error = exc
                    continue
                if new is not None:
                    status, changed = new, True
            return status if changed else None

        try:
            written = await update_status(self._objects, self._namespace, self._name, together, current=self.obj)
        except Exception as exc:
            self.obj = None  # unknown now: the next read or write reads it afresh
            for queued in batch:
                queued.sent, queued.error = True, exc
            raise
        except BaseException:
            # This caller was cancelled mid-write: the others it carried have no answer; the next caller to hold
            # the line sends them again (a mutation is the same on any read of the status).
            self.obj = None
            self._queued[:0] = [q for q in batch if q is not mine]
            raise
        self.obj = written
        for queued in batch:
            queued.sent, queued.written = True, written


class _Queued:
    __slots__ = ("error", "mutate", "sent", "written")

    def __init__(self, mutate: StatusMutation) -> None:
        self.mutate = mutate
        self.sent = False
        self.written: Obj | None = None
        self.error: BaseException | None = None


class WorkerMarkerStore:
    """MarkerStore on ``status.workerRolls.<machine>`` of the operation, written through the step's line."""

    def __init__(self, line: StatusLine, machine: str) -> None:
        self._line, self._machine = line, machine
        #: The operation as the write that recorded the worker done returned it (None until then).
        self.closed: Obj | None = None

    async def read(self) -> RollMarker:
        obj = await self._line.read()
        entry = ((obj.get("status") or {}).get(SLOTS) or {}).get(self._machine) or {}
        return _marker(entry, f"status.{SLOTS}.{self._machine}")

    async def write(self, marker: RollMarker) -> None:
        if not marker.rebooting and self._machine in marker.done:
            # Done: straight into status.roll.done, the slot freed, in this one write (as closing does).
            self.closed = await self._line.update(closing(self._machine))
            return
        machine = self._machine

        def mutate(status: Obj, _obj: Obj) -> Obj | None:
            slots = dict(status.get(SLOTS) or {})
            if machine in slots and _marker(slots[machine], "") == marker:
                return None
            slots[machine] = _entry(marker, (slots.get(machine) or {}).get("startedAt"))
            status[SLOTS] = slots
            return status

        await self._line.update(mutate)


def in_flight(status: Obj) -> list[str]:
    return sorted(k for k, v in (status.get(SLOTS) or {}).items() if v is not None)


def markers(status: Obj) -> list[RollMarker]:
    """The roll marker of every worker under way (a marker that cannot be read is left out)."""
    out = []
    for name, entry in sorted((status.get(SLOTS) or {}).items()):
        if isinstance(entry, dict):
            try:
                out.append(_marker(entry, f"status.{SLOTS}.{name}"))
            except MarkerFormatError:
                continue
    return out


def to_start(planned: list[PlannedMachine], status: Obj, max_unavailable: int) -> list[PlannedMachine]:
    """The workers to take now: next in order, not done, not under way, within the bound; never the last."""
    roll = marker_from_status(status, ROLL_FIELDS)
    busy = set(in_flight(status))
    free = max(0, max_unavailable - len(busy))
    parallel = [p for p in planned[:-1] if not p.is_control_plane]
    return [p for p in parallel if p.name not in roll.done and p.name not in busy][:free]


def opening(machines: list[str], now: datetime) -> StatusMutation:
    """Record the workers as under way before anything is done to any of them (each counts against the bound from
    now, and its step is timed from ``now``: operations/progress.py), in one write for all of them: a round of
    twenty taken one write (and one read) each made the round's first step twenty round trips longer."""
    def mutate(status: Obj, _obj: Obj) -> Obj | None:
        slots = dict(status.get(SLOTS) or {})
        new = [m for m in machines if m not in slots]
        if not new:
            return None
        for machine in new:
            slots[machine] = {"done": [], "startedAt": format_time(now)}
        status[SLOTS] = slots
        return status

    return mutate


def closing(machine: str) -> StatusMutation:
    """The worker is done: into status.roll.done, its marker removed (one write)."""
    def mutate(status: Obj, _obj: Obj) -> Obj | None:
        slots = dict(status.get(SLOTS) or {})
        roll = dict(status.get(ROLL_FIELDS.section) or {})
        done = list(roll.get(ROLL_FIELDS.done) or [])
        if slots.get(machine) is None and machine in done:
            return None
        slots[machine] = None  # a merge patch removes a nested key only when it is spelled null
        if machine not in done:
            done.append(machine)
        roll[ROLL_FIELDS.done] = done
        status[SLOTS], status[ROLL_FIELDS.section] = slots, roll
        return status

    return mutate


def machine_of(machines: list[MachineView], name: str) -> MachineView | None:
    return next((m for m in machines if m.name == name), None)
