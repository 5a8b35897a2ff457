#!/usr/bin/env python3
"""Benchmark a ``config`` rollout (docs/decisions.md#config-rollout) of a reboot-class patch on 3 control planes + W
workers; prints JSON.

For each ``--max-unavailable`` value a fresh simulated cluster (Talos nodes, its managed Kubernetes API, ichord's
objects on a separate management API) is patched with a reboot-class change, the machine reconciler reports it,
and one ``config`` operation rolls it out through the daemon's own cluster actor loop (ichord.actors.actor: a step,
then the outcome's delay or the next routed informer event, whichever is first) and registry, in process. A
simulated reboot takes ``--reboot-time`` unscaled seconds x ``--time-scale`` (every other simulated delay and
ichord's own Timing are scaled by the same factor).

Figures per run: ``wall_s`` (operation created -> Completed); ``floor_s``, the rollout as
docs/decisions.md#config-rollout defines it with nothing else in it: control planes one at a time, then the
workers but the plan's last in rounds of maxUnavailable, then the last alone, each round one node's reboot
(shutdown and boot) plus the settle the decision mandates (Node Ready on the new boot, a control plane back in
etcd; the simulator reports both the moment the node is up, so that settle is 0 here); ``ratio`` (wall / floor);
``where`` (scripts/rollout_timeline.py: the critical path's time by segment, from the simulators' own marks, and
each segment's mean over the workers); ``steps`` (the actor's steps, time inside them, the messages that woke it by
kind: ``Node`` is a managed Node back from its reboot) and ``requests`` (the management API's writes by resource,
its reads by verb and resource, the managed API's requests by verb); ``reboots`` (the simulators' count, one per
machine expected) and ``most_workers_down`` (never above k); ``cpu_s`` (this process's CPU over the rollout:
ichord's code and the simulators together, the figure a loaded machine disturbs least) and ``load_1m``.

``--management real``: ichord's objects live on a real kube-apiserver + etcd (scripts/real_management.py, the real
tier's server; exits 1 when scripts/tools.sh has not built it); the managed cluster stays simulated. ``requests``
then counts the management API's requests as the server did (apiserver_request_total).

Usage: .venv/bin/python scripts/bench_config.py [-W 100] [--max-unavailable 1,5,20] [--reboot-time 60]
       [--time-scale 0.01] [--management sim|real] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchkit
import real_management
import structlog
from rollout_timeline import Timeline

from ichord.actors.actor import ClusterActor
from ichord.actors.cluster import ClusterReconciler, Runtime
from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.operations.kinds import default_registry
from ichord.operations.outcome import Outcome, Requeue
from ichord.pki.bundle import generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.node import Timings
from ichord.sim.talos.run import scaled
from ichord.watchers.informer import Informer, Resource
from ichord.watchers.routing import Router

SMOKE = {"workers": 4, "max_unavailable": "1,2", "reboot_time": 20.0}
REBOOT_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"


def floor(control_planes: int, workers: int, k: int, per_node: float) -> float:
    """The rollout with nothing but what docs/decisions.md#config-rollout mandates: control planes one by one, the
    workers but the plan's last k at a time, the last one alone; each round one node's reboot and settle."""
    return per_node * (control_planes + math.ceil(max(0, workers - 1) / k) + (1 if workers else 0))


def per_node(timings: Timings) -> float:
    """One node's reboot as the simulator runs it (shutdown, then down until the new boot) plus the mandated settle:
    Node Ready on the new boot and a control plane back in etcd, both at once on the simulator (sim/combined/follow.py
    flips Ready when the node is up; its etcd member starts at boot)."""
    return timings.reboot_shutdown + timings.reboot


def _by(entries: Any, key: Any) -> dict[str, int]:
    counts: Counter[str] = Counter(key(e) for e in entries)
    return dict(sorted((k, v) for k, v in counts.items() if k))


async def one_run(bundle: Any, workers: int, k: int, reboot_time: float, scale: float, management: str,
                  ) -> dict[str, Any]:
    timings = replace(scaled(scale), reboot=reboot_time * scale)
    timing = Timing().scaled(scale)  # every operation names its maxUnavailable: the daemon default is not used
    async with SimEnvironment(bundle=bundle, time_scale=scale, control_planes=3, workers=workers,
                              management_api="separate", timings=timings) as env, \
            contextlib.AsyncExitStack() as stack:
        real: real_management.RealManagement | None = None
        if management == "real":
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-config-")))
            real = await stack.enter_async_context(real_management.running(workdir))
            await real.copy_namespace(env.management.store, env.namespace)
            kube = await stack.enter_async_context(await real.client(timing))
        else:
            kube = await stack.enter_async_context(await from_kubeconfig(env.kubeconfig, timing=timing))
        return await _run(env, kube, real, workers, k, timings, timing)


async def _run(env: SimEnvironment, kube: Any, real: real_management.RealManagement | None, workers: int, k: int,
               timings: Timings, timing: Timing) -> dict[str, Any]:
    informers = {k_: Informer(kube, Resource(names.GROUP, names.VERSION, names.PLURALS[k_]), timing=timing)
                 for k_ in (names.TALOS_CLUSTER, names.TALOS_MACHINE, names.TALOS_OPERATION)}
    recorder = EventRecorder(kube, instance="bench")
    rt = Runtime(kube, env.namespace, informers[names.TALOS_CLUSTER], informers[names.TALOS_MACHINE],
                 informers[names.TALOS_OPERATION], recorder, timing, resync=3600, registry=default_registry())
    tasks = [asyncio.create_task(inf.run()) for inf in informers.values()] + [asyncio.create_task(recorder.run())]
    timeline = Timeline()
    timeline.nodes = {node.nodename: name for name, node in env.talos.nodes.items()}
    try:
        for inf in informers.values():
            await inf.wait_synced()
        reconciler = ClusterReconciler(rt, env.namespace, env.cluster_name)
        crashes: list[str] = []
        step_time: list[float] = []
        changed = asyncio.Event()

        async def step(messages: dict[Any, str]) -> Outcome:
            started = time.perf_counter()
            try:
                return await reconciler.step(messages)
            except Exception as exc:
                # As the actor's supervisor does (a step that raises is restarted after a backoff): a
                # management API call over its scaled timeout on a loaded machine is no end of the run.
                crashes.append(type(exc).__name__)
                print(f"step raised, retried: {exc!r}", file=sys.stderr, flush=True)
                return Requeue(timing.step_retry_initial, "step raised")
            finally:
                step_time.append(time.perf_counter() - started)
                changed.set()

        actor = ClusterActor(reconciler.key, step)

        told: Counter[str] = Counter()

        def tell(namespace: str, cluster: str, obj: tuple[str, str], reason: str) -> None:
            if (namespace, cluster) == (env.namespace, env.cluster_name):
                told[obj[0]] += 1
                actor.tell(obj, reason)

        rt.wake = tell  # as the daemon does: a managed Node back from its reboot wakes the actor
        router = Router(tell)
        router.active = True
        informers[names.TALOS_CLUSTER].add_handler(router.on_cluster)
        informers[names.TALOS_MACHINE].add_handler(router.on_machine)
        informers[names.TALOS_OPERATION].add_handler(router.on_operation)
        # The wait below ends the moment the operation's own watch shows it Completed, not at the next step's end or
        # a second later (which added up to a second to wall_s).
        informers[names.TALOS_OPERATION].add_handler(lambda _event: changed.set())
        tasks.append(asyncio.create_task(actor.run()))

        async def until(pred: Any, what: str, within: float) -> None:
            deadline = benchkit.Deadline(within, what)
            while not pred():
                deadline.check()
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)

        def reported() -> bool:
            return sum(1 for o in informers[names.TALOS_MACHINE].items()
                       if (o.get("status") or {}).get("rebootPaths")) == 3 + workers

        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [REBOOT_PATCH]}})
        await until(reported, "every machine reporting rebootPaths", 300)
        since = len(env.talos.history.events)
        env.talos.history.listeners.append(timeline.on_talos)
        env.kube.store.listeners.append(timeline.on_managed)
        if real is None:
            env.management.store.listeners.append(timeline.on_management)
        else:
            informers[names.TALOS_OPERATION].add_handler(
                lambda event: timeline.on_operation(event.obj, deleted=event.type == "DELETED"))
        managed_before, management_before = len(env.kube.requests.entries), len(env.management.requests.entries)
        server_before = real.counts() if real is not None else None
        steps_before = len(step_time)
        told.clear()
        t0, cpu0 = time.perf_counter(), time.process_time()
        timeline.start = time.monotonic()
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "bench"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "config", "maxUnavailable": k}})

        def finished() -> bool:
            op = informers[names.TALOS_OPERATION].get(env.namespace, "bench") or {}
            # Paused is retried (a fault or a bound, e.g. a slow API under load); only the end counts
            return (op.get("status") or {}).get("phase") in ("Completed", "Failed")

        await until(finished, "the rollout", 3600)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        steps = step_time[steps_before:]
        managed_requests = env.kube.requests.entries[managed_before:]
        management_requests = env.management.requests.entries[management_before:]
        server = real_management.delta(real.counts(), server_before) \
            if real is not None and server_before is not None else None
        op = await crds.operations(kube).get(env.namespace, "bench")
        actor.stop()
        reconciler.close()
        await rt.registry.close()
    finally:
        for t in tasks:
            t.cancel()
        # Bounded: asyncio.wait_for on Python 3.11 can lose a cancel that races a watch line (gh-86296).
        _, stuck = await asyncio.wait(tasks, timeout=10)
        if stuck:
            print(f"{len(stuck)} informer task(s) ignored their cancel", file=sys.stderr, flush=True)
    events = env.talos.history.events[since:]
    reboots = sum(1 for e in events if e["kind"] == "reboot")
    down: set[str] = set()
    most = 0
    for e in events:
        if "-worker-" not in (e.get("node") or ""):
            continue
        if e["kind"] == "down":
            down.add(e["node"])
        elif e["kind"] in ("up", "boot"):
            down.discard(e["node"])
        most = max(most, len(down))
    plan = [str(m["name"]) for m in ((op.get("status") or {}).get("plan") or {}).get("machines") or []]
    worker_names = {m.name for m in env.machines if m.role == "worker"}
    lowest = floor(3, workers, k, per_node(timings))
    write_verbs = ("create", "update", "patch", "delete")
    writes = [e for e in management_requests if e.verb in write_verbs]
    requests: dict[str, Any] = {"management_writes": _by(writes, lambda e: e.resource),
                                "management_reads": _by([e for e in management_requests if e.verb not in write_verbs],
                                                        lambda e: f"{e.verb} {e.resource}"),
                                "managed": _by(managed_requests, lambda e: e.verb)}
    if server is not None:  # the real server's own count (its own traffic included: leases, endpoints)
        requests = {"management_server": server, "managed": requests["managed"]}
    return {"max_unavailable": k, "workers": workers, "phase": op["status"]["phase"],
            **({} if op["status"]["phase"] == "Completed" else {"message": op["status"].get("message", "")}),
            "wall_s": round(wall, 3), "floor_s": round(lowest, 3), "ratio": round(wall / lowest, 3),
            "cpu_s": round(cpu, 3), "load_1m": round(os.getloadavg()[0], 2),
            "where": {"critical_path": timeline.critical_path(plan, worker_names),
                      "worker_means_s": timeline.means([m for m in plan if m in worker_names])},
            "steps": {"count": len(steps), "in_steps_s": round(sum(steps), 3), "woken_by": dict(told),
                      "mean_ms": round(1000 * sum(steps) / len(steps), 1) if steps else 0.0},
            "requests": requests, "management": "real" if real is not None else "sim",
            "reboots": reboots, "most_workers_down": most, "steps_raised": len(crashes)}


async def main(args: argparse.Namespace) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only: stdout is JSON
    bundle = generate_bundle()
    runs = []
    for k in [int(x) for x in str(args.max_unavailable).split(",") if x]:
        runs.append(await one_run(bundle, args.workers, k, args.reboot_time, args.time_scale, args.management))
        print(json.dumps({"figure": "run", **runs[-1]}), flush=True)
    summary = {"figure": "summary", "control_planes": 3, "workers": args.workers, "management": args.management,
               "reboot_s_scaled": args.reboot_time * args.time_scale,
               "runs": {str(r["max_unavailable"]): {"wall_s": r["wall_s"], "floor_s": r["floor_s"],
                                                    "ratio": r["ratio"], "cpu_s": r["cpu_s"],
                                                    "load_1m": r["load_1m"]} for r in runs},
               "all_completed": all(r["phase"] == "Completed" for r in runs),
               "one_reboot_each": all(r["reboots"] == 3 + args.workers for r in runs),
               "bound_held": all(r["most_workers_down"] <= r["max_unavailable"] for r in runs)}
    print(json.dumps(summary), flush=True)
    benchkit.require(summary, equal={"all_completed": True, "one_reboot_each": True, "bound_held": True})
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-W", "--workers", type=int, default=100)
    p.add_argument("--max-unavailable", default="1,5,20", help="comma-separated values, one run each")
    p.add_argument("--reboot-time", type=float, default=60.0, help="a simulated reboot, unscaled seconds")
    p.add_argument("--time-scale", type=float, default=0.01)
    p.add_argument("--management", choices=("sim", "real"), default="sim",
                   help="where ichord's objects live: the simulator, or a real kube-apiserver (scripts/tools.sh)")
    try:
        sys.exit(asyncio.run(main(benchkit.parse_args(p, SMOKE))))
    except real_management.ControlPlaneError as exc:
        print(f"{benchkit.name()}: no figures for --management real: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
