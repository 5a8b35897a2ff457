"""What the demo sees: each machine's Ready condition (API server store) and its applies (Talos history)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from ichord.demo.view import View
    from ichord.sim.combined import SimEnvironment
    from ichord.sim.kube.events import Change
    from ichord.sim.kube.resources import ResourceType


class DemoFailed(Exception):
    """A step did not happen as shown; the message says which and what was seen instead."""


@dataclass
class Row:
    """One machine as the demo sees it: its Ready condition and the applies its node accepted."""

    name: str
    role: str
    node: str
    ready: str = "-"
    reason: str = "-"
    message: str = ""
    config_hash: str = ""
    reboot_paths: list[str] = field(default_factory=list)
    applies: list[tuple[str, str]] = field(default_factory=list)  # (config hash, mode)
    stage: str = ""  # the CA rotation stage the last apply happened in ("" outside a rotation)
    running: str = ""  # hash of the configuration the node runs (no-reboot applies take effect at once)


class Observer:
    """Follows the TalosMachines in the API server's store and the applies in the Talos history."""

    def __init__(self, env: SimEnvironment, view: View) -> None:
        self.env = env
        self.view = view
        self.rows = {m.name: Row(m.name, m.role, env.node(m.name).name) for m in env.machines}
        self._by_node = {r.node: r for r in self.rows.values()}
        self._changed = anyio.Event()  # set on every change seen; `until` re-checks then
        self.stage = ""  # set by the CA rotation step while it runs

    def attach(self) -> None:
        self.env.management.store.listeners.append(self._on_change)
        self.env.talos.history.listeners.append(self._on_event)

    def detach(self) -> None:
        if self._on_change in self.env.management.store.listeners:
            self.env.management.store.listeners.remove(self._on_change)
        if self._on_event in self.env.talos.history.listeners:
            self.env.talos.history.listeners.remove(self._on_event)

    def _on_change(self, change: Change, rt: ResourceType) -> None:
        if rt.plural != "talosmachines" or change.namespace != self.env.namespace:
            return
        row = self.rows.get(change.new["metadata"]["name"])
        if row is None:
            return
        status = change.new.get("status") or {}
        self._changed.set()
        row.config_hash = str(status.get("configHash") or "")
        row.reboot_paths = list(status.get("rebootPaths") or [])
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is None or (ready.get("status"), ready.get("reason")) == (row.ready, row.reason):
            return
        row.ready, row.reason, row.message = str(ready["status"]), str(ready["reason"]), str(ready.get("message", ""))
        self.view.transition(row)

    def _on_event(self, event: dict[str, Any]) -> None:
        row = self._by_node.get(str(event.get("node")))
        if event.get("kind") != "apply" or row is None:
            return
        row.applies.append((str(event["config_hash"]), str(event["mode"])))
        row.running = row.applies[-1][0]
        row.stage = self.stage
        self._changed.set()
        self.view.applied(row)

    async def until(self, pred: Callable[[Row], bool], within: float, what: str) -> None:
        """Wait until ``pred`` holds for every machine; DemoFailed naming the ones it does not hold for."""
        with anyio.move_on_after(within):
            while True:
                self._changed = anyio.Event()
                if all(pred(r) for r in self.rows.values()):
                    return
                await self._changed.wait()
        late = [r for r in self.rows.values() if not pred(r)]
        if not late:  # it came true just as the time ran out
            return
        names = ", ".join(f"{r.name} ({r.reason})" for r in late)
        said = f"; {late[0].name} says: {late[0].message}" if late[0].message else ""
        raise DemoFailed(f"{what} did not happen within {within:g} s; still waiting for: {names}{said}")


def _expect_applies(obs: Observer, expected: Callable[[Row], list[tuple[str, str]]], when: str) -> None:
    for r in obs.rows.values():
        want = expected(r)
        if r.applies != want:
            seen = ", ".join(f"{m} {h[:12]}" for h, m in r.applies) or "none"
            wanted = ", ".join(f"{m} {h[:12]}" for h, m in want) or "none"
            raise DemoFailed(f"{r.name}: expected the applies {wanted} {when}, the node accepted: {seen}")
