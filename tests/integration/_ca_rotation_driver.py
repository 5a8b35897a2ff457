"""Drives ``advance`` step by step against a SimEnvironment, as the cluster actor would (a new context per
step: nothing survives in memory), playing the operator for the hand-off when asked."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from ichord.api import names
from ichord.api.conditions import find
from ichord.contract import VersionContract
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import NotFound, Unavailable
from ichord.kube.events import EventRecorder
from ichord.operations.ca_rotation import advance
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.managed.clients import ManagedClients
from ichord.operations.managed.context import StepContext
from ichord.operations.outcome import Blocked, Done, Failed, Outcome, Requeue
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

Obj = dict[str, Any]
# retry 60 ms, client settle 240 ms, kubelet settle 180 ms; the restart bound stays above the condition
# timestamps' one-second resolution, and so do the kube-apiserver restart's "unchanged" window and bound (the
# simulators run at their own scale: a restart begins some tens of ms after the apply).
TIMING = replace(Timing().scaled(0.002), ca_client_restart_timeout=30.0, ca_apiserver_unchanged=2.0,
                 ca_apiserver_ready_bound=30.0)


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
    #: The managed-cluster clients kept across steps, as ca_rotation_operation keeps them in the daemon.
    managed: ManagedClients = field(default_factory=ManagedClients)

    def _factory(self, dial: DialBundle) -> TalosClient:
        driver = self

        class Watched(TalosClient):
            async def apply_configuration(self, endpoint: str, data: bytes, mode: int, *, contract: VersionContract,
                                          dry_run: bool = False, node: str | None = None) -> Any:
                if not dry_run:
                    driver.applies.append((endpoint, names.ROTATION_KEY in secret_data(driver.env)))
                out = await super().apply_configuration(endpoint, data, mode, contract=contract, dry_run=dry_run,
                                                       node=node)
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

    def context(self) -> StepContext:
        return StepContext(self.kube, self.env.namespace, self.recorder, self.timing,
                           trust_hook=lambda new, _current: self.trusted.append(new),
                           talos_factory=self._factory, managed=self.managed)

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
        try:
            op = await self.get()
            if (self.acknowledge
                    and (op.get("status") or {}).get("caRotation", {}).get("stage") == "AwaitingCredentials"):
                token = handoff_token(op["status"]["caRotation"]["certificates"])
                annotations = (op["metadata"].get("annotations") or {})
                if annotations.get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                    await crds.operations(self.kube).patch(self.env.namespace, self.op_name, {"metadata": {
                        "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
                    op = await self.get()
        except Unavailable:
            # The API server is the managed cluster's own and restarts for the new CAs; the actor would read its
            # informer's copy and step anyway, the driver reads the API and so looks again shortly.
            return Requeue(0.05, "the API server is restarting")
        try:
            outcome = await advance(self.context(), op)
        except IchordError:
            # The registry's error policy (operations/step_errors.py): a typed error is a retry of the step.
            return Requeue(0.05, "step failed")
        except BaseException:
            await self.managed.close_all()  # a crashed step's process would not have kept them either
            raise
        with contextlib.suppress(NotFound, Unavailable):  # deleted once its finalizer went, or restarting
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


# ---- what the ca-rotation test files share ---------------------------------------------------------

#: The in-cluster clients Finalizing restarts for the flannel preset (kube-system).
FLANNEL_CLIENTS = (("daemonsets", "kube-flannel"), ("daemonsets", "kube-proxy"), ("deployments", "coredns"))


def client_workload(plural: str, name: str, *, replicas: int | None = None) -> Obj:
    """A kube-system DaemonSet or Deployment for the simulator's rollouts (a Deployment gets ``replicas``)."""
    kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
    spec: Obj = {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": name, "image": f"{name}:1"}]}}}
    if kind == "Deployment" and replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "kube-system"},
            "spec": spec}


def add_clients(env: SimEnvironment, clients: tuple[tuple[str, str], ...] = FLANNEL_CLIENTS, *,
                replicas: int | None = 2) -> None:
    store = env.kube.store
    for plural, name in clients:
        store.create(store.resolve("apps", "v1", plural), "kube-system", client_workload(plural, name,
                                                                                         replicas=replicas))


@contextlib.asynccontextmanager
async def driving(env: SimEnvironment, **options: Any) -> AsyncIterator[Driver]:
    """A Driver on ``env`` with its own client and Event recorder.

    The management API is the managed cluster's own: it serves from the new Kubernetes CA from Issuing
    on, so the client trusts the base CA plus what the rotation hands the trust seam (the trust pool's
    part in the daemon).
    """
    trusted: list[bytes] = []
    assert env.bundle is not None
    base = env.bundle.k8s.cert_pem
    async with await from_kubeconfig(env.kubeconfig, trust=lambda: [base, *trusted]) as kube:
        recorder = EventRecorder(kube)
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            driver = Driver(env, kube, recorder, trusted=trusted, **options)
            try:
                yield driver
            finally:
                await driver.managed.close_all()
            await recorder.drain()
            tg.cancel_scope.cancel()


def at(stage: str) -> Callable[[Obj], bool]:
    """A ``Driver.run(until=...)`` predicate: the operation is in ``stage``."""
    return lambda o: (o.get("status") or {}).get("caRotation", {}).get("stage") == stage


def blocked_on(text: str) -> Callable[[Obj], bool]:
    """A ``Driver.run(until=...)`` predicate: CARotation is Blocked with ``text`` in its message."""
    def pred(o: Obj) -> bool:
        cond = find((o.get("status") or {}).get("conditions"), names.CA_ROTATION)
        return bool(cond and cond["reason"] == "Blocked" and text in cond["message"])
    return pred
