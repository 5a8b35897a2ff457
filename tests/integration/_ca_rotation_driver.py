"""Drives ``advance`` step by step against a SimEnvironment, as the cluster actor would (a new context per
step: nothing survives in memory), playing the operator for the hand-off when asked."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound
from ichord.kube.events import EventRecorder
from ichord.operations.ca_rotation import RotationContext, advance
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.outcome import Blocked, Done, Failed, Outcome, Requeue
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

Obj = dict[str, Any]
# retry 60 ms, client settle 240 ms, kubelet settle 180 ms; the restart bound stays above the condition
# timestamps' one-second resolution.
TIMING = replace(Timing().scaled(0.002), ca_client_restart_timeout=30.0)


class Crash(Exception):
    """Stands for the process being killed at that point (the in-process twin of a failpoint)."""


def secret_data(env: SimEnvironment) -> dict[str, bytes]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def live_bundle(env: SimEnvironment) -> SecretsBundle:
    return SecretsBundle.from_yaml(secret_data(env)[names.SECRETS_KEY])


def live_rotation(env: SimEnvironment) -> Rotation | None:
    raw = secret_data(env).get(names.ROTATION_KEY)
    return None if raw is None else Rotation.from_yaml(raw)


@dataclass
class Driver:
    env: SimEnvironment
    kube: KubeClient
    recorder: EventRecorder
    op_name: str = "rotate"
    timing: Timing = TIMING
    #: Applies (non-dry-run) seen, as (machine endpoint, rotation.yaml present in the Secret at that moment).
    applies: list[tuple[str, bool]] = field(default_factory=list)
    crash_after_applies: int | None = None
    acknowledge: bool = True
    snapshots: list[Obj] = field(default_factory=list)
    trusted: list[bytes] = field(default_factory=list)
    #: Fault injection: called as inject(method, endpoint) before every MachineConfig and Version read.
    inject: Callable[[str, str], None] | None = None

    def _factory(self, dial: DialBundle) -> TalosClient:
        driver = self

        class Watched(TalosClient):
            async def apply_configuration(self, endpoint: str, data: bytes, mode: int, *, dry_run: bool = False,
                                          node: str | None = None) -> Any:
                if not dry_run:
                    driver.applies.append((endpoint, names.ROTATION_KEY in secret_data(driver.env)))
                out = await super().apply_configuration(endpoint, data, mode, dry_run=dry_run, node=node)
                if (not dry_run and driver.crash_after_applies is not None
                        and len(driver.applies) >= driver.crash_after_applies):
                    driver.crash_after_applies = None
                    raise Crash("killed after an apply, before the status write")
                return out

            async def machine_config(self, endpoint: str, *, persistent: bool = False,
                                     node: str | None = None) -> bytes:
                if driver.inject is not None:
                    driver.inject("MachineConfig", endpoint)
                return await super().machine_config(endpoint, persistent=persistent, node=node)

            async def version(self, endpoint: str, *, node: str | None = None) -> Any:
                if driver.inject is not None:
                    driver.inject("Version", endpoint)
                return await super().version(endpoint, node=node)

        return Watched(dial, dial_timeout=0.5, rpc_timeout=10)

    def context(self) -> RotationContext:
        return RotationContext(self.kube, self.env.namespace, self.recorder, self.timing,
                               trust_hook=lambda new, _current: self.trusted.append(new),
                               talos_factory=self._factory)

    async def create(self, *, targets: list[str] | None = None, paused: bool = False,
                     annotations: dict[str, str] | None = None) -> Obj:
        spec: Obj = {"clusterRef": {"name": self.env.cluster_name}, "kind": "ca-rotation", "paused": paused}
        if targets is not None:
            spec["caRotation"] = {"targets": targets}
        meta: Obj = {"name": self.op_name}
        if annotations:
            meta["annotations"] = annotations
        return await crds.operations(self.kube).create(self.env.namespace, {"metadata": meta, "spec": spec})

    async def get(self) -> Obj:
        return await crds.operations(self.kube).get(self.env.namespace, self.op_name)

    async def step(self) -> Outcome:
        op = await self.get()
        if self.acknowledge and (op.get("status") or {}).get("caRotation", {}).get("stage") == "AwaitingCredentials":
            token = handoff_token(op["status"]["caRotation"]["certificates"])
            annotations = (op["metadata"].get("annotations") or {})
            if annotations.get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await crds.operations(self.kube).patch(self.env.namespace, self.op_name, {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
                op = await self.get()
        outcome = await advance(self.context(), op)
        with contextlib.suppress(NotFound):  # deleted once its finalizer went
            self.snapshots.append(await self.get())
        return outcome

    async def run(self, *, max_steps: int = 400, until: Callable[[Obj], bool] | None = None,
                  max_wait: float = 0.25) -> Outcome:
        """Step until Done/Failed (or ``until`` holds), sleeping what each outcome asks (capped)."""
        outcome: Outcome = Done()
        for _ in range(max_steps):
            try:
                outcome = await self.step()
            except Crash:
                continue  # "restarted": the next step reads everything afresh
            if isinstance(outcome, Done | Failed):
                return outcome
            if until is not None and self.snapshots and until(self.snapshots[-1]):
                return outcome
            delay = outcome.after if isinstance(outcome, Requeue) else (
                outcome.retry_after if isinstance(outcome, Blocked) else 0.0)
            await anyio.sleep(min(max(delay, 0.005), max_wait))
        raise AssertionError(f"the rotation did not finish in {max_steps} steps; last outcome {outcome!r}, "
                             f"status {self.snapshots[-1].get('status') if self.snapshots else None}")


def stages_seen(snapshots: list[Obj]) -> list[str]:
    out: list[str] = []
    for s in snapshots:
        stage = ((s.get("status") or {}).get("caRotation") or {}).get("stage")
        if stage and (not out or out[-1] != stage):
            out.append(stage)
    return out
