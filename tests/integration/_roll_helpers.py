"""Shared by the reboot-roll tests: the plan of a simulated environment, a TalosOperation holding the marker,
a clock that can be moved forward, and a loop that steps the roll as the actor would (requeue = wait)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from ichord.contract import VersionContract
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.operations.outcome import next_delay
from ichord.operations.roll import (
    Admit,
    Gate,
    KubeNodes,
    RollHooks,
    RollOutcome,
    RollTalos,
    RollTarget,
    TalosNodes,
    advance_roll,
)
from ichord.operations.roll_store import StatusMarkerStore
from ichord.settings import Timing
from ichord.talos.client import TalosClient

OPERATION = "roll"


def control_plane_plan(machines: Sequence[Any], endpoints: dict[str, str], nodenames: dict[str, str]) -> list[
        RollTarget]:
    """cp-1, cp-2, cp-3 in order: machine name, Talos endpoint, Node name."""
    return [RollTarget(m.name, endpoints[m.name], nodenames[m.name]) for m in machines if m.role == "controlplane"]


async def create_operation(kc: KubeClient, namespace: str, cluster: str, name: str = OPERATION) -> StatusMarkerStore:
    """A TalosOperation whose status.caRotation carries the marker (what the backbone will use)."""
    ops = crds.operations(kc)
    await ops.create(namespace, {"metadata": {"name": name},
                                 "spec": {"clusterRef": {"name": cluster}, "kind": "ca-rotation"}})
    return StatusMarkerStore(ops, namespace, name)


class MovableClock:
    """Wall time plus an offset the test moves forward, so a 20-minute bound passes without waiting for it."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@dataclass
class Roll:
    plan: list[RollTarget]
    store: StatusMarkerStore
    talos: TalosClient
    managed: KubeClient
    contract: VersionContract
    timing: Timing
    clock: Callable[[], datetime] = field(default_factory=MovableClock)
    gates: Sequence[Gate] = ()
    verifiers: Sequence[Gate] = ()
    hooks: RollHooks | None = None
    admit: Admit | None = None
    #: Wraps the step's Talos port (the real one, over mutual TLS): a test orders the simulator's events between
    #: the roll's reads with it.
    wrap_talos: Callable[[RollTalos], RollTalos] | None = None
    outcomes: list[RollOutcome] = field(default_factory=list)

    async def step(self) -> RollOutcome:
        port: RollTalos = TalosNodes(self.talos, self.contract)
        if self.wrap_talos is not None:
            port = self.wrap_talos(port)
        out = await advance_roll(self.plan, self.store, port, KubeNodes(self.managed),
                                 gates=self.gates, verifiers=self.verifiers, hooks=self.hooks, timing=self.timing,
                                 clock=self.clock, admit=self.admit)
        self.outcomes.append(out)
        return out

    async def until(self, stop: Callable[[RollOutcome], bool], *, steps: int = 400) -> RollOutcome:
        """Step, waiting what each outcome asks, until ``stop(outcome)``; AssertionError after ``steps``."""
        for _ in range(steps):
            out = await self.step()
            if stop(out):
                return out
            await anyio.sleep(next_delay(out.outcome) or 0.0)
        raise AssertionError(f"the roll did not get there in {steps} steps; last: {self.outcomes[-1]}")

    async def to_done(self, *, steps: int = 400) -> RollOutcome:
        return await self.until(lambda o: o.finished or o.pause, steps=steps)
