"""What the machine reconciler is told about a machine an operation disrupts on purpose (a reboot, a kube-apiserver
restart): the operations find them in their markers (ichord/operations/disruptions.py), the reconciler reports
them as planned (ichord/machines/reconciler.py); this is the data both sides share."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass


class Disruption(enum.StrEnum):
    REBOOT = "reboot"
    API_SERVER_RESTART = "kube-apiserver restart"


@dataclass(frozen=True)
class PlannedDisruption:
    machine: str
    what: Disruption
    operation: str  # namespace/name of the operation that asked for it
    since: dt.datetime  # when it was asked for (the marker's time)
    bound: float  # seconds after ``since`` it may last before it counts as a loss

    def overdue(self, now: dt.datetime) -> bool:
        return (now - self.since).total_seconds() >= self.bound

    def describe(self) -> str:
        at = self.since.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"the {self.what.value} that operation {self.operation} asked for at {at}"


def by_machine(disruptions: list[PlannedDisruption]) -> dict[str, PlannedDisruption]:
    """One disruption per machine: a reboot outranks an API-server restart (it takes the whole node away)."""
    out: dict[str, PlannedDisruption] = {}
    for d in disruptions:
        held = out.get(d.machine)
        if held is None or (held.what is Disruption.API_SERVER_RESTART and d.what is Disruption.REBOOT):
            out[d.machine] = d
    return out
