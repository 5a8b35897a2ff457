#!/usr/bin/env python3
"""Benchmark a ca-rotation (default talos, kubernetes; --targets) on C clusters x M machines at once; prints one JSON
object.

Every cluster is a SimEnvironment (Talos nodes + its own managed Kubernetes API, client workloads);
ichord's objects of all of them live on ONE shared management API simulator, as in production.
Every wait is scaled to ~zero (``--time-scale`` for the rotation's Timing and the simulators'
delays), so the wall time is the work itself plus ``--apply-latency`` (seconds every
ApplyConfiguration RPC, dry runs included, takes on the simulated node).

Modes:
- ``inprocess``: one step loop per cluster calls ``advance`` (as the cluster actor does) on the main
  thread; ``rotation_cpu_s`` (time.thread_time of the main thread) is the client side: TLS, JSON, rendering.
- ``daemon``: ``ichord run`` as a subprocess (ICHORD_TIME_SCALE=--daemon-time-scale: leader election
  scales too, so it cannot go to ~zero; the rotation's settle waits are then seconds). The daemon's
  CPU is its user+sys from /proc/<pid>/stat between the operations' creation and the last Completed.
  Its machine reconciler runs too: its Talos reads are counted with the rotation's.

The simulators run in a process of their own (``--sims process``, the default): in production the nodes' CPU is
not ichord's, and on a thread of this process (``--sims thread``) they would share the client's GIL, so a wide
pass would time the simulators as much as ichord. ``sims_cpu_s`` is that process's CPU over the rotation.

Counted on the simulators' side and attributed to the pass by the operation's status.caRotation.stage
read at each request: Talos RPCs by method (ApplyConfiguration split into dry runs and applies; ``Get``
is COSI State Get, i.e. MachineConfig reads) and Kubernetes requests (writes by verb/resource, status
vs spec; reads summed), per machine. A Kubernetes request is counted once served, so the status write
that enters a stage counts in that stage; requests naming no cluster (Events, the leader Lease) are
under "(any)". ``apply_span_s``: per pass, first apply request to the end of the last (mean over
clusters); ``max_concurrent_applies``: the most real applies in flight at once on one cluster.

With the etcd target every pass ends with a reboot roll of the control planes (docs/decisions.md#etcd-reboot-roll):
``--reboot-time`` is a simulated reboot's unscaled seconds (default 60, multiplied by --time-scale like
every other delay); ``talos_rpcs_per_control_plane`` counts the requests served by control planes only,
and ``reboots`` compares the control-plane reboots the simulators saw with the plan's stated count
(three per control plane).

Workers are applied up to the bound at once (``--max-unavailable``: a count or a percentage of the workers, as
Kubernetes' maxUnavailable; default the daemon's, 25%), control planes one at a time. ``--compare-serial`` runs the
same world twice, fresh each time (one by one, maxUnavailable 1, then with the bound), and prints both and
``speedup``: the passes' wall time (Accepting + Issuing + Dropping, mean over clusters) one by one over bounded.

``--management real`` (in-process mode): ichord's objects live on a real kube-apiserver + etcd
(scripts/real_management.py, the real tier's server; exits 1 when scripts/tools.sh has not built it) instead of the
management API simulator; the managed clusters stay simulated. ``management_server`` is then the server's own count
of the requests over the rotation (apiserver_request_total: by verb, and the writes by resource; its own traffic
included), and the management requests per machine per pass are not counted (the simulator counted them); a request
is attributed to the stage the bench last saw the operation write (told to the simulators at each write).

Usage: .venv/bin/python scripts/bench_rotation.py [-C 3] [-M 4|3+5] [--apply-latency 0.5]
       [--mode inprocess|daemon] [--max-unavailable N|N%] [--compare-serial] [--targets talos,kubernetes,etcd]
       [--reboot-time 60] [--management sim|real] [--smoke]

--smoke: one cluster of one control plane and one worker, every supported target (both roles' passes and the etcd
roll, in seconds); exits non-zero
unless every rotation completed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import anyio
import benchkit
import real_management
import structlog
from grpclib.events import RecvMessage, RecvRequest, listen

from ichord.api import names
from ichord.api.max_unavailable import MaxUnavailable, MaxUnavailableError
from ichord.api.names import API_VERSION
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.operations.ca_rotation import advance
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.managed.clients import ManagedClients
from ichord.operations.managed.context import StepContext
from ichord.operations.outcome import Blocked, Done, Failed, Requeue
from ichord.pki.bundle import generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment, objects
from ichord.sim.combined.env import scaled_behaviours
from ichord.sim.kube.rest import WatchSettings
from ichord.sim.kube.server import DEFAULT_CRD_DIR, KubeSimulator, SimSettings
from ichord.sim.talos.run import scaled
from ichord.talos.proto.gen.machine import machine_pb2

NS = "ichord-system"
PASSES = ("Accepting", "Issuing", "Dropping", "Finalizing")
CLIENTS = (("daemonsets", "kube-flannel"), ("daemonsets", "kube-proxy"), ("deployments", "coredns"))
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
T = TypeVar("T")
SMOKE = {"clusters": 1, "machines": "1+1", "within": 60.0, "targets": "talos,kubernetes,etcd"}


def workload(plural: str, name: str) -> dict[str, Any]:
    kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": f"{name}:1"}]}}}}


def parse_machines(raw: str) -> tuple[int, int]:
    """``4`` -> 3 control planes + 1 worker (fewer than 4: all control planes); ``3+5`` -> 3 + 5."""
    if "+" in raw:
        cps, workers = (int(x) for x in raw.split("+", 1))
    else:
        n = int(raw)
        cps, workers = min(n, 3), max(n - 3, 0)
    if cps < 1 or workers < 0:
        raise argparse.ArgumentTypeError(f"-M {raw!r}: need at least one control plane (N or CPS+WORKERS)")
    return cps, workers


@dataclass
class Counts:
    """What the simulators served, by (stage, what); stage is the operation's at the request."""

    talos: Counter[tuple[str, str]] = field(default_factory=Counter)
    kube: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (node, start, end) of every real apply (perf_counter), for the overlap figure.
    applies: list[tuple[str, float, float]] = field(default_factory=list)
    #: (cluster, stage) -> [first, last] time an ApplyConfiguration request (dry run or not) arrived.
    apply_window: dict[tuple[str, str], list[float]] = field(default_factory=dict)


class Bench:
    """The shared management API, C environments, and the counters hooked into them."""

    def __init__(self, clusters: int, cps: int, workers: int, *, time_scale: float, apply_latency: float,
                 targets: tuple[str, ...] = (), reboot_time: float = 60.0) -> None:
        self.n, self.cps, self.workers = clusters, cps, workers
        self.time_scale, self.apply_latency = time_scale, apply_latency
        self.targets, self.reboot_time = targets, reboot_time
        #: Talos requests served by control planes only, by (stage, method).
        self.cp_talos: Counter[tuple[str, str]] = Counter()
        self.mgmt = KubeSimulator(SimSettings(
            host="127.0.0.1", port=0, token=secrets.token_urlsafe(24), crd_dir=DEFAULT_CRD_DIR, window=200_000,
            watch=WatchSettings(bookmark_interval=60.0 * time_scale), behaviours=scaled_behaviours(time_scale)))
        self.envs: list[SimEnvironment] = []
        self.counts = Counts()
        self.watching = False
        #: The operations' stages as the bench saw them written (``--management real``: the operations are not in
        #: this process's store); None: read from the management simulator's store at each request.
        self.stages: dict[str, str] | None = None
        group, version = API_VERSION.split("/", 1)
        self._ops_key = (group, version, "talosoperations")

    @property
    def machines(self) -> int:
        return self.n * (self.cps + self.workers)

    def cluster_name(self, i: int) -> str:
        return f"c{i + 1:03d}"

    def stage(self, cluster: str | None) -> str:
        if cluster is None:
            return "(any)"
        if self.stages is not None:
            return self.stages.get(cluster, "(new)")
        rt = self.mgmt.store.types.get(self._ops_key)
        obj = self.mgmt.store.objects.get(rt.key, {}).get((NS, f"rotate-{cluster}")) if rt else None
        if obj is None:
            return "(none)"
        return str(((obj.get("status") or {}).get("caRotation") or {}).get("stage") or "(new)")

    def cluster_of(self, path: str) -> str | None:
        for seg in path.split("/"):
            for env in self.envs:
                c = env.cluster_name
                if seg == c or seg.startswith(c + "-") or seg.endswith("-" + c):
                    return c
        return None

    def _hook_kube(self, sim: KubeSimulator, cluster: str | None, api: str) -> None:
        add = sim.requests.add

        def counted(verb: str, path: str, status: int, resource: str = "") -> None:
            add(verb, path, status, resource)
            if not self.watching:
                return
            owner = cluster or self.cluster_of(path)
            what = (f"{api} {verb} {resource}{'/status' if path.endswith('/status') else ''}" if verb in WRITES
                    else f"{api} reads")
            self.counts.kube[(self.stage(owner), what)] += 1

        sim.requests.add = counted  # type: ignore[method-assign]

    def _hook_talos(self, env: SimEnvironment) -> None:
        cluster = env.cluster_name
        sim = env.talos

        def hook(name: str) -> None:
            server = sim._servers[name]
            cp = sim.nodes[name].is_control_plane

            async def on_request(event: RecvRequest) -> None:
                if self.watching:
                    method = event.method_name.rsplit("/", 1)[-1]
                    if method != "ApplyConfiguration":  # split by dry run below, from the message
                        self.counts.talos[(self.stage(cluster), method)] += 1
                        if cp:
                            self.cp_talos[(self.stage(cluster), method)] += 1

            async def on_message(event: RecvMessage) -> None:
                if self.watching and isinstance(event.message, machine_pb2.ApplyConfigurationRequest):
                    kind = "ApplyConfiguration(dry run)" if event.message.dry_run else "ApplyConfiguration"
                    stage = self.stage(cluster)
                    self.counts.talos[(stage, kind)] += 1
                    if cp:
                        self.cp_talos[(stage, kind)] += 1
                    now = time.perf_counter()
                    window = self.counts.apply_window.setdefault((cluster, stage), [now, now])
                    window[1] = now

            listen(server, RecvRequest, on_request)
            listen(server, RecvMessage, on_message)

        for name in list(sim._servers):
            hook(name)
        listen_node = sim.listen

        async def listen_hooked(node: Any) -> None:
            # A rebooted node listens on a new server: hook it too, or the roll's RPCs after a reboot go uncounted.
            fresh = node.name not in sim._servers
            await listen_node(node)
            if fresh and node.name in sim._servers:
                hook(node.name)

        sim.listen = listen_hooked  # type: ignore[method-assign]

    async def start(self) -> None:
        await self.mgmt.start()
        self._hook_kube(self.mgmt, None, "management")
        bundle = generate_bundle()
        timings = replace(scaled(self.time_scale), apply_duration=self.apply_latency,
                          reboot=self.reboot_time * self.time_scale)
        for i in range(self.n):
            env = SimEnvironment(control_planes=self.cps, workers=self.workers, bundle=bundle, namespace=NS,
                                 cluster_name=self.cluster_name(i), time_scale=self.time_scale, timings=timings,
                                 management_api="separate")
            self.envs.append(env)
            await env.start()
            for plural, name in CLIENTS:
                env.kube.store.create(env.kube.store.resolve("apps", "v1", plural), "kube-system",
                                      workload(plural, name))
            # ichord's objects on the shared management API (the environment's own stays unused).
            objects.create_objects(self.mgmt.store, namespace=NS, cluster=env.cluster_name, secret=env.secret_name,
                                   bundle=bundle, cspec=env.cluster_spec, mspecs=env.machine_specs)
            self._hook_kube(env.kube, env.cluster_name, "managed")
            self._hook_talos(env)

    async def stop(self) -> None:
        for env in self.envs:
            await env.stop()
        await self.mgmt.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        return self.mgmt.write_kubeconfig(path, namespace=NS)

    def documents(self) -> list[tuple[str, str, dict[str, Any]]]:
        """ichord's objects as created on the management simulator, to create on a real server instead."""
        return real_management.documents(self.mgmt.store, NS)

    def set_stage(self, cluster: str, stage: str) -> None:
        if self.stages is None:
            self.stages = {}
        self.stages[cluster] = stage

    def ready(self) -> dict[str, str]:
        return bench_ready(self)

    def sims_cpu_s(self) -> float | None:
        return None  # on a thread of this process: not separable from the client's

    def reboots(self) -> dict[str, Any]:
        """Control-plane reboots the simulators saw, against the plan's three per control plane with etcd."""
        seen = sum(1 for env in self.envs for e in env.talos.history.of("reboot")
                   if env.talos.nodes[e["node"]].is_control_plane)
        planned = 3 * self.cps * self.n if "etcd" in self.targets else 0
        return {"control_plane_reboots": seen, "planned": planned, "per_control_plane": round(seen / max(
            self.cps * self.n, 1), 2), "matches_plan": seen == planned}

    def record_applies(self) -> None:
        for env in self.envs:
            for e in env.talos.history.of("apply"):
                self.counts.applies.append((f"{env.cluster_name}/{e['node']}", e["at"] - self.apply_latency, e["at"]))


class SimThread:
    """Runs the Bench's simulators on their own thread and event loop."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sims", daemon=True)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __enter__(self) -> Bench:
        self._thread.start()
        self.call(self.bench.start())
        return self.bench

    def __exit__(self, *exc: object) -> None:
        self.call(self.bench.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


class _ClusterName:
    """What the client side needs of a simulated environment that lives in another process: its cluster's name."""

    def __init__(self, name: str) -> None:
        self.cluster_name = name


class RemoteBench:
    """The client side's view of a Bench served by a SimProcess: the same attributes the runners read, and the
    counts fetched once (``record_applies``) when the rotation is over."""

    def __init__(self, process: SimProcess, bench: Bench, clusters: list[str]) -> None:
        self._process = process
        self.n, self.cps, self.workers, self.targets = bench.n, bench.cps, bench.workers, bench.targets
        self.envs = [_ClusterName(c) for c in clusters]
        self.counts = Counts()
        self.cp_talos: Counter[tuple[str, str]] = Counter()
        self._reboots: dict[str, Any] = {}
        self._watching = False

    @property
    def machines(self) -> int:
        return self.n * (self.cps + self.workers)

    @property
    def watching(self) -> bool:
        return self._watching

    @watching.setter
    def watching(self, value: bool) -> None:
        self._process.call("watch", value)  # acknowledged: no request is served between this and the next line
        self._watching = value

    def write_kubeconfig(self, path: Path) -> Path:
        return Path(self._process.call("kubeconfig", str(path)))

    def documents(self) -> list[tuple[str, str, dict[str, Any]]]:
        return list(self._process.call("documents"))

    def set_stage(self, cluster: str, stage: str) -> None:
        self._process.call("stage", (cluster, stage))  # acknowledged: counted in it from the next request on

    def ready(self) -> dict[str, str]:
        return dict(self._process.call("ready"))

    def record_applies(self) -> None:
        got = self._process.call("results")
        self.counts, self.cp_talos, self._reboots = got["counts"], got["cp_talos"], got["reboots"]

    def reboots(self) -> dict[str, Any]:
        return self._reboots

    def sims_cpu_s(self) -> float | None:
        return proc_cpu(self._process.pid)


def _serve_bench(bench: Bench, conn: Connection) -> None:
    """The child's side of a SimProcess: start ``bench``, then answer the parent's calls until "stop"."""

    async def main() -> None:
        await bench.start()
        conn.send(("ok", [env.cluster_name for env in bench.envs]))
        loop = asyncio.get_running_loop()
        while True:
            what, arg = await loop.run_in_executor(None, conn.recv)
            if what == "stop":
                await bench.stop()
                conn.send(("ok", None))
                return
            if what == "watch":
                bench.watching = bool(arg)
                answer: Any = None
            elif what == "kubeconfig":
                answer = str(bench.write_kubeconfig(Path(arg)))
            elif what == "ready":
                answer = bench.ready()
            elif what == "documents":
                answer = bench.documents()
            elif what == "stage":
                bench.set_stage(*arg)
                answer = None
            else:  # "results"
                bench.record_applies()
                answer = {"counts": bench.counts, "cp_talos": bench.cp_talos, "reboots": bench.reboots()}
            conn.send(("ok", answer))

    try:
        asyncio.run(main())
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


class SimProcess:
    """Runs the Bench's simulators in a process of their own (forked), answering calls over a pipe.

    In production the nodes' CPU is not ichord's: with the simulators on a thread of the bench's process they share
    its GIL, and a wide pass then measures the simulators as much as ichord (issue 19). Here the client side has
    the process to itself; the counters stay where the requests are served and come back at the end."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self._conn, child = multiprocessing.get_context("fork").Pipe()
        self._proc = multiprocessing.get_context("fork").Process(
            target=_serve_bench, args=(bench, child), name="sims", daemon=True)
        self.pid = 0

    def call(self, what: str, arg: Any = None) -> Any:
        self._conn.send((what, arg))
        return self._answer()

    def _answer(self) -> Any:
        if not self._conn.poll(600):
            raise SystemExit(f"{benchkit.name()}: the simulators' process did not answer within 600 s")
        status, value = self._conn.recv()
        if status != "ok":
            raise SystemExit(f"{benchkit.name()}: the simulators' process failed: {value}")
        return value

    def __enter__(self) -> RemoteBench:
        self._proc.start()
        self.pid = self._proc.pid or 0
        return RemoteBench(self, self.bench, list(self._answer()))

    def __exit__(self, *exc: object) -> None:
        try:
            if self._proc.is_alive():
                self.call("stop")
        finally:
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(10)


async def create_operations(kube: KubeClient, bench: Bench | RemoteBench) -> None:
    for env in bench.envs:
        spec: dict[str, Any] = {"clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}
        if bench.targets:
            spec["caRotation"] = {"targets": list(bench.targets)}
        await crds.operations(kube).create(NS, {"metadata": {"name": f"rotate-{env.cluster_name}"}, "spec": spec})


async def hand_off(kube: KubeClient, op: dict[str, Any]) -> bool:
    """Play the operator in AwaitingCredentials (as `ichord cluster credentials --acknowledge` does)."""
    status = op.get("status") or {}
    if (status.get("caRotation") or {}).get("stage") != "AwaitingCredentials":
        return False
    token = handoff_token(status["caRotation"]["certificates"])
    if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) == token:
        return False
    await crds.operations(kube).patch(NS, op["metadata"]["name"], {"metadata": {
        "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
    return True


async def drive(ctx: StepContext, name: str, *, max_steps: int = 2000,
                seen: Callable[[dict[str, Any]], None] = lambda _op: None) -> dict[str, Any]:
    """One cluster's rotation, step by step, sleeping what each outcome asks (capped at 50 ms); ``seen`` is told
    of every read of the operation."""
    ops = crds.operations(ctx.kube)
    steps = 0
    spent: dict[str, float] = defaultdict(float)
    stage, since = "(new)", time.perf_counter()
    for steps in range(1, max_steps + 1):  # noqa: B007
        op = await ops.get(NS, name)
        if await hand_off(ctx.kube, op):
            op = await ops.get(NS, name)
        seen(op)
        now = time.perf_counter()
        spent[stage] += now - since
        stage, since = stage_of(op), now
        if (op.get("status") or {}).get("phase") in ("Completed", "Failed"):
            break
        outcome = await advance(ctx, op)
        if isinstance(outcome, Failed | Done) and (op.get("status") or {}).get("phase") == "Failed":
            break
        delay = outcome.after if isinstance(outcome, Requeue) else (
            outcome.retry_after if isinstance(outcome, Blocked) else 0.0)
        await anyio.sleep(min(max(delay, 0.0), 0.05))
    op = await ops.get(NS, name)
    return {"phase": (op.get("status") or {}).get("phase"), "steps": steps, "spent": spent}


def stage_of(op: dict[str, Any]) -> str:
    return str(((op.get("status") or {}).get("caRotation") or {}).get("stage") or "(new)")


def mean_spent(spent: list[dict[str, float]]) -> dict[str, float]:
    """Seconds in each stage, averaged over the clusters."""
    total: dict[str, float] = defaultdict(float)
    for s in spent:
        for k, v in s.items():
            total[k] += v
    return {k: round(v / max(len(spent), 1), 3) for k, v in total.items()}


async def run_inprocess(bench: Bench | RemoteBench, kubeconfig: Path, timing: Timing,
                        plane: real_management.ControlPlane | None = None) -> dict[str, Any]:
    """``plane``: ichord's objects go on that real server (--management real), the simulators are told each
    operation's stage as it is written (they count each request in it), and the server's own counts are taken."""
    async with await from_kubeconfig(kubeconfig, timing=timing) as kube:
        stages: dict[str, str] = {}

        def seen(op: dict[str, Any]) -> None:
            cluster = str(((op.get("spec") or {}).get("clusterRef") or {}).get("name") or "")
            if plane is not None and cluster and stages.get(cluster) != stage_of(op):
                stages[cluster] = stage_of(op)
                bench.set_stage(cluster, stages[cluster])

        recorder = EventRecorder(kube, instance="bench", burst=10_000)
        managed = ManagedClients()  # kept across steps and stages as the daemon's registry keeps them
        ctx = StepContext(kube, NS, recorder, timing, managed=managed, observe=seen)
        results: dict[str, dict[str, Any]] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            if plane is not None:
                await real_management.create_objects(kube, NS, bench.documents())
            await create_operations(kube, bench)
            server_before = real_management.counts_of(plane) if plane is not None else None
            bench.watching = True
            cpu, wall, sims = time.thread_time(), time.perf_counter(), bench.sims_cpu_s()

            async def one(cluster: str) -> None:
                results[cluster] = await drive(ctx, f"rotate-{cluster}", seen=seen)

            async with anyio.create_task_group() as clusters:
                for env in bench.envs:
                    clusters.start_soon(one, env.cluster_name)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            sims_after = bench.sims_cpu_s()
            bench.watching = False
            server = real_management.delta(real_management.counts_of(plane), server_before) \
                if plane is not None and server_before is not None else None
            await managed.close_all()
            await recorder.drain()
            tg.cancel_scope.cancel()
    return {"wall_s": round(wall, 3), "rotation_cpu_s": round(cpu, 3),
            **({"management_server": server} if server is not None else {}),
            "sims_cpu_s": round(sims_after - sims, 3) if sims is not None and sims_after is not None else None,
            "phases": dict(Counter(str(r["phase"]) for r in results.values())),
            "steps_per_cluster": max(r["steps"] for r in results.values()),
            "stage_wall_s": mean_spent([r["spent"] for r in results.values()])}


def proc_cpu(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start_daemon(kubeconfig: Path, log: Path, scale: str, bound: MaxUnavailable) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "ICHORD_TIME_SCALE": scale}
    for name in ("KUBECONFIG", "ICHORD_MAX_UNAVAILABLE", "ICHORD_CA_WORKER_APPLY_CONCURRENCY"):
        environ.pop(name, None)
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "ichord.cli", "run", "--kubeconfig", str(kubeconfig), "--controller-namespace", NS,
             "--identity", "bench", "--metrics-addr", "127.0.0.1:0", "--log-level", "warning",
             "--max-unavailable", str(bound)],
            stdout=out, stderr=subprocess.STDOUT, env=environ)


async def run_daemon(bench: Bench | RemoteBench, kubeconfig: Path, proc: subprocess.Popen[bytes], scale: str,
                     within: float) -> dict[str, Any]:
    try:
        async with await from_kubeconfig(kubeconfig) as kube:
            with anyio.fail_after(120):  # every machine converged before the rotation starts
                while set(bench.ready().values()) != {"True/Converged"}:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            cpu0 = proc_cpu(proc.pid)
            await create_operations(kube, bench)
            bench.watching = True
            wall = time.perf_counter()
            phases: dict[str, str] = {}
            spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            seen: dict[str, tuple[str, float]] = {}
            with anyio.fail_after(within):
                while len(phases) < bench.n:
                    for env in bench.envs:
                        name = f"rotate-{env.cluster_name}"
                        if name in phases:
                            continue
                        op = await crds.operations(kube).get(NS, name)
                        now = time.perf_counter()
                        prev, since = seen.get(name, ("(new)", wall))
                        spent[name][prev] += now - since
                        seen[name] = (stage_of(op), now)
                        await hand_off(kube, op)
                        phase = (op.get("status") or {}).get("phase")
                        if phase in ("Completed", "Failed"):
                            phases[name] = str(phase)
                    await anyio.sleep(0.02)
            wall = time.perf_counter() - wall
            bench.watching = False
            cpu = proc_cpu(proc.pid) - cpu0
    finally:
        proc.terminate()
    return {"wall_s": round(wall, 3), "daemon_cpu_s": round(cpu, 3), "daemon_time_scale": float(scale),
            "phases": dict(Counter(phases.values())), "stage_wall_s": mean_spent(list(spent.values()))}


def bench_ready(bench: Bench) -> dict[str, str]:
    group, version = API_VERSION.split("/", 1)
    rt = bench.mgmt.store.resolve(group, version, "talosmachines")
    out = {}
    # Read from another thread than the simulator's: a copy of the bucket, retried if it changed meanwhile.
    for _ in range(10):
        try:
            items = list(bench.mgmt.store.objects.get(rt.key, {}).items())
            break
        except RuntimeError:
            continue
    else:
        return {}
    for key, obj in items:
        out[key[1]] = next((f"{c.get('status')}/{c.get('reason')}" for c in (obj.get("status") or {}).get(
            "conditions") or [] if c.get("type") == "Ready"), "")
    return out


def per_pass(counts: Counter[tuple[str, str]], machines: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (stage, what), n in sorted(counts.items()):
        out[stage][what] = round(n / machines, 2)
    order = {s: i for i, s in enumerate(("(new)", "Pending", "Accepting", "AwaitingCredentials", *PASSES[1:], "Done"))}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], 99)))


def apply_spans(windows: dict[tuple[str, str], list[float]], latency: float) -> dict[str, float]:
    """Per pass, seconds from the first apply request to the end of the last, averaged over the clusters."""
    spans: dict[str, list[float]] = defaultdict(list)
    for (_cluster, stage), (first, last) in windows.items():
        spans[stage].append(last - first + latency)
    return {stage: round(sum(v) / len(v), 3) for stage, v in spans.items()}


def overlap(applies: list[tuple[str, float, float]], predicate: Callable[[str], bool]) -> int:
    """The most real applies in flight at once on one cluster's nodes matching ``predicate``."""
    best = 0
    for cluster in {n.split("/", 1)[0] for n, _, _ in applies}:
        mine = [(s, e) for n, s, e in applies if n.startswith(cluster + "/") and predicate(n)]
        cur = 0
        for _, d in sorted([(s, 1) for s, _ in mine] + [(e, -1) for _, e in mine]):
            cur += d
            best = max(best, cur)
    return best


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-C", "--clusters", type=int, default=3)
    ap.add_argument("-M", "--machines", type=parse_machines, default=(3, 1), help="N (3 cps + N-3 workers) or CPS+W")
    ap.add_argument("--apply-latency", type=float, default=0.0, help="seconds per ApplyConfiguration RPC on a node")
    ap.add_argument("--mode", choices=("inprocess", "daemon"), default="inprocess")
    ap.add_argument("--sims", choices=("process", "thread"), default="process",
                    help="where the simulators run: a process of their own (default; the nodes' CPU is not ichord's, "
                    "as in production) or a thread of this one (they share the client's GIL)")
    ap.add_argument("--time-scale", type=float, default=0.0005, help="scale of every wait (in-process, simulators)")
    ap.add_argument("--daemon-time-scale", default="0.02", help="ICHORD_TIME_SCALE of the daemon")
    ap.add_argument("--max-unavailable", type=max_unavailable, default=None, metavar="N|N%",
                    help="the workers a pass applies at once, a count or a percentage of the workers (default: the "
                    "daemon's default, 25%%)")
    ap.add_argument("--compare-serial", action="store_true",
                    help="run the same world twice, fresh each time: one by one (maxUnavailable 1), then with the "
                    "bound; print both and the passes' speedup")
    ap.add_argument("--within", type=float, default=300.0, help="give up after this many seconds")
    ap.add_argument("--targets", default="",
                    help="spec.caRotation.targets, comma-separated (default: talos,kubernetes)")
    ap.add_argument("--reboot-time", type=float, default=60.0,
                    help="a simulated reboot's seconds before --time-scale (the etcd target's roll)")
    ap.add_argument("--management", choices=("sim", "real"), default="sim",
                    help="where ichord's objects live: the simulator, or a real kube-apiserver (scripts/tools.sh; "
                    "in-process mode)")
    args = benchkit.parse_args(ap, SMOKE)
    if args.management == "real" and args.mode != "inprocess":
        ap.error("--management real runs in-process (--mode inprocess): the daemon mode reads the machines' "
                 "readiness from the management simulator")
    bound: MaxUnavailable = args.max_unavailable or Timing().max_unavailable
    try:
        compare(args, bound)
    except real_management.ControlPlaneError as exc:
        print(f"{benchkit.name()}: no figures for --management real: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


def compare(args: argparse.Namespace, bound: MaxUnavailable) -> None:
    """One run, or with --compare-serial one by one and bounded; prints the figures and checks them."""
    if not args.compare_serial:
        figures = run(args, bound)
        print(json.dumps(figures, indent=1))
        check(figures, args.clusters)
        return
    serial, bounded = run(args, MaxUnavailable(count=1)), run(args, bound)
    walls = {"one_by_one": serial["passes_wall_s"], "bounded": bounded["passes_wall_s"]}
    figures = {"benchmark": "ca_rotation_compare_serial", "max_unavailable": str(bound),
               "workers_at_once": bounded["workers_at_once"], "passes_wall_s": walls,
               "wall_s": {"one_by_one": serial["wall_s"], "bounded": bounded["wall_s"]},
               "speedup": round(walls["one_by_one"] / walls["bounded"], 2) if walls["bounded"] else None,
               "one_by_one": serial, "bounded": bounded}
    print(json.dumps(figures, indent=1))
    check(serial, args.clusters)
    check(bounded, args.clusters)
    benchkit.require(figures, ("speedup",))


def max_unavailable(text: str) -> MaxUnavailable:
    try:
        return MaxUnavailable.parse_text(text)
    except MaxUnavailableError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check(figures: dict[str, Any], clusters: int) -> None:
    # A rotation that did not complete (out of steps, Failed) leaves figures of half a rotation.
    benchkit.require(figures, ("wall_s", "applies_total", "passes_counted", "passes_wall_s"),
                     equal={"phases": {"Completed": clusters}, "reboots.matches_plan": True})


def run(args: argparse.Namespace, bound: MaxUnavailable) -> dict[str, Any]:
    """One world built fresh, one rotation per cluster with ``bound`` as the daemon's maxUnavailable: its figures."""
    cps, workers = args.machines
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    bench = Bench(args.clusters, cps, workers, time_scale=args.time_scale, apply_latency=args.apply_latency,
                  targets=targets, reboot_time=args.reboot_time)
    timing = Timing().scaled(args.time_scale)
    # The restart bound stays above the condition timestamps' one-second resolution (as the tests do).
    timing = replace(timing, ca_client_restart_timeout=30.0, kube_request_timeout=30.0, min_call_timeout=5.0,
                     renew_deadline=60.0, cluster_lock_duration=60.0,
                     # The roll's bounds stay above a scaled reboot: a count of reboots, not of re-requests.
                     reboot_retry=max(timing.reboot_retry, 30.0), node_action_timeout=max(timing.node_action_timeout,
                                                                                          120.0))
    timing = replace(timing, max_unavailable=bound)
    setup = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        # The real server first: the simulators' process is forked after it (it holds no handle of it).
        plane = stack.enter_context(real_management.started(Path(tmp))) if args.management == "real" else None
        runner = SimProcess(bench) if args.sims == "process" else SimThread(bench)
        b = stack.enter_context(runner)
        setup = time.perf_counter() - setup
        kubeconfig = plane.admin_kubeconfig if plane is not None else b.write_kubeconfig(Path(tmp) / "kubeconfig")
        if args.mode == "inprocess":
            result = anyio.run(run_inprocess, b, kubeconfig, timing, plane)
        else:
            log = Path(tmp) / "daemon.log"
            proc = start_daemon(kubeconfig, log, args.daemon_time_scale, bound)

            async def daemon() -> dict[str, Any]:
                return await run_daemon(b, kubeconfig, proc, args.daemon_time_scale, args.within)
            try:
                result = anyio.run(daemon)
            except BaseException:
                sys.stderr.write(log.read_text(errors="replace")[-4000:])
                raise
            finally:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        b.record_applies()
        talos = per_pass(b.counts.talos, b.machines)
        cp_talos = per_pass(b.cp_talos, b.cps * b.n)
        reboots = b.reboots()
        kube = per_pass(b.counts.kube, b.machines)
        applies = len(b.counts.applies)
        spans = apply_spans(b.counts.apply_window, args.apply_latency)
    figures = {
        "benchmark": "ca_rotation", "mode": args.mode, "clusters": args.clusters, "control_planes": cps,
        "workers": workers, "machines": bench.machines, "apply_latency_s": args.apply_latency, "sims": args.sims,
        "management": args.management,
        "max_unavailable": str(bound), "workers_at_once": bound.workers_at_once(workers),
        "setup_s": round(setup, 1), **result, "apply_span_s": spans, "applies_total": applies,
        "max_concurrent_applies": {
            "control_planes": overlap(b.counts.applies, lambda n: "-cp-" in n),
            "workers": overlap(b.counts.applies, lambda n: "-worker-" in n)} if args.apply_latency else None,
        "targets": list(targets) or ["talos", "kubernetes"], "reboot_time_s": args.reboot_time,
        "reboots": reboots, "talos_rpcs_per_control_plane": cp_talos,
        "talos_rpcs_per_machine": talos, "kube_requests_per_machine": kube,
        "passes_counted": len(talos), "python": sys.version.split()[0]}
    # The passes' wall time: what the bound shortens (the other stages wait on settles and the operator).
    figures["passes_wall_s"] = round(sum(figures["stage_wall_s"].get(p, 0.0) for p in PASSES[:3]), 3)
    return figures


if __name__ == "__main__":
    main()
