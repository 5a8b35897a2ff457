#!/usr/bin/env python3
"""What `ichord run` costs for C clusters x M machines: cold convergence, then a measured idle window.

    .venv/bin/python scripts/bench_idle.py [--clusters 10] [--machines 4] [--idle-seconds 60]
                                           [--time-scale 1] [--resync SECONDS] [--settle 5]
                                           [--management sim|real] [--talos-processes N] [--first-a A]
                                           [--daemon-profile daemon.prof] [--workdir DIR] [--smoke]

One Kubernetes API simulator (this process) holds every TalosCluster, TalosMachine and bundle Secret,
as the management cluster does in production; each cluster's Talos nodes are simulated in their own
127.A.B.0/24 block (ichord.sim.combined.fleet). `ichord run` runs as a subprocess against it with
ICHORD_TIME_SCALE=--time-scale (1: real durations, the 300 s drift resync, so idle means idle).

--management real: ichord's objects live on a real etcd + kube-apiserver, started as the real test tier starts
them (tests/real/controlplane.py, binaries from scripts/tools.sh; exits 1 when they are not built), created through
the API with the admin kubeconfig the daemon also uses; the managed clusters' Talos nodes stay simulated. The
request figures are then the server's own (apiserver_request_total on its /metrics, by verb and resource), which
include this script's: one LIST and one WATCH of TalosMachines (how convergence is seen) and the object creation
before the daemon starts (not in the figures: counted from the daemon's start).

Figures, one JSON line each (stdout):
  start     - the fleet's start time by phase (bundle, render, talos listen, objects)
  converge  - seconds from the daemon's start until every TalosMachine is Ready=True/Converged
              (the store is polled directly), and the requests / RPCs that took
  idle      - over --idle-seconds after convergence (+ --settle): daemon RSS, CPU seconds and CPU %,
              open fds, Kubernetes requests per minute by verb and by verb+resource (the server's count: under
              --management real it includes kube-apiserver's own traffic), the daemon's own requests per minute
              (daemon_kube_per_min, from its ichord_kube_request_duration_seconds), Talos RPCs per minute
              by method (every simulated service method is counted in this process), and the daemon's own
              steps by what woke them (a timer, or the kind of object whose change was told) and watch restarts
  summary   - the headline numbers on one line
  progress  - every 30 s while converging (converged count, Ready reasons, daemon CPU/RSS, the daemon's
              warning/error log events so far); converge_incomplete when the daemon exits or --converge-timeout
              passes first (then the exit status is 1)
--talos-processes N: the Talos nodes served from N child processes of this script (default: one per 12,000 nodes;
more than one needs --management real): one process may not hold more than its open-files limit of listening
sockets (5,000 x 4 nodes need two here). Their RPC counts and CPU seconds are summed into the figures.
Machines per cluster: --machines M gives 3 control planes + (M-3) workers (M < 4: M control planes).
A 60 s window sees no drift resync (every 300 s per machine): --idle-seconds 330 covers one round of it.
Convergence needs ~1 s of daemon CPU per cluster: C=10 takes ~15 s, C=100 ~2 min (figures in the issue note).
--smoke: one cluster of one machine, a 3 s window (the whole path in ~6 s); exits non-zero without figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import benchkit
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.real.controlplane: the real tier's server

from ichord.api.names import GROUP, VERSION
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import AlreadyExists
from ichord.settings import Timing
from ichord.sim.combined.fleet import FIRST_A as FLEET_FIRST_A
from ichord.sim.combined.fleet import Fleet
from ichord.sim.kube.faults import RequestLog
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from ichord.sim.talos import services
from ichord.watchers import Informer, Resource
from tests.real.controlplane import ControlPlane, ControlPlaneError

CLK_TCK = os.sysconf("SC_CLK_TCK")
SMOKE = {"clusters": 1, "machines": 1, "idle_seconds": 3.0, "settle": 0.5, "converge_timeout": 60.0}
TALOS_RPCS: Counter[str] = Counter()


def count_talos_rpcs() -> None:
    """Count every call of every simulated gRPC method (patched on the classes before any node starts)."""
    for cls in (services.MachineService, services.StateService):
        for name, fn in list(vars(cls).items()):
            if name[:1].isupper() and inspect.iscoroutinefunction(fn):
                setattr(cls, name, _counted(f"{cls.__name__}.{name}", fn))


def _counted(label: str, fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        TALOS_RPCS[label] += 1
        await fn(*args, **kwargs)
    return wrapper


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---- /proc ------------------------------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) in KiB and the thread count."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- counters ---------------------------------------------------------------------------------

def kube_counts(log: RequestLog) -> tuple[Counter[str], Counter[str], int]:
    """Requests by verb, by verb+resource, and the total, so far."""
    by_verb: Counter[str] = Counter()
    by_resource: Counter[str] = Counter()
    for e in log.entries:
        by_verb[e.verb] += 1
        by_resource[f"{e.verb} {e.resource or '-'}"] += 1
    return by_verb, by_resource, len(log.entries)


#: kube-apiserver's verbs (apiserver_request_total) in the simulator's words.
SERVER_VERBS = {"GET": "get", "LIST": "list", "WATCH": "watch", "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete", "DELETECOLLECTION": "deletecollection", "APPLY": "patch"}
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def server_counts(metrics: str) -> tuple[Counter[str], Counter[str], int]:
    """Requests by verb, by verb+resource and the total, from kube-apiserver's apiserver_request_total (its own
    count of every request it served; the resource carries its subresource: talosmachines/status)."""
    by_verb: Counter[str] = Counter()
    by_resource: Counter[str] = Counter()
    for line in metrics.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        labels = dict(part.split("=", 1) for part in labels_text[len("apiserver_request_total{"):-1].split(",")
                      if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        verb = SERVER_VERBS.get(labels.get("verb", ""), labels.get("verb", "").lower())
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        n = int(float(value))
        by_verb[verb] += n
        by_resource[f"{verb} {resource or '-'}"] += n
    return by_verb, by_resource, sum(by_verb.values())


class LocalTalos:
    """The fleet's Talos nodes served by this process (the default): its RPC counts and CPU are this process's."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.namespace = fleet.namespace
        self.timing = fleet.timing

    @property
    def documents(self) -> list[dict[str, Any]]:
        return self.fleet.documents

    @property
    def machine_count(self) -> int:
        return self.fleet.machine_count

    async def start(self) -> None:
        await self.fleet.start()

    async def stop(self) -> None:
        await self.fleet.stop()

    async def rpcs(self) -> Counter[str]:
        return Counter(TALOS_RPCS)

    async def cpu(self) -> float:
        return self_cpu()


#: The Talos nodes one share process serves at most: each node is a listening socket, and a process may not raise
#: its own hard limit of open files (20,000 here); the rest is left for the connections the daemon opens.
NODES_PER_SHARE = 12_000


class SharedTalos:
    """The fleet's Talos nodes split over ``n`` child processes of this script (``--talos-share k/n``), each with
    its own open-files limit and its own core: 5,000 clusters x 4 machines are 20,000 listening sockets, more than
    one process may hold here. Each share is a Fleet of its own (its own bundle, cluster names ``s<k>c0001``...,
    its own 127.A.0.0 blocks); it writes its objects to a file for this process to create on the real server, and
    answers ``rpcs`` on its stdin with its RPC counts and CPU seconds (one JSON line)."""

    def __init__(self, clusters: int, n: int, args: argparse.Namespace, workdir: Path) -> None:
        self.shares = [clusters // n + (1 if k < clusters % n else 0) for k in range(n)]
        self.args = args
        self.workdir = workdir
        self.namespace = "ichord-system"
        self.timing: dict[str, float] = {}
        self.documents: list[dict[str, Any]] = []
        self.machine_count = 0
        self.procs: list[asyncio.subprocess.Process] = []
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        span = max(self.shares) // 256 + 2  # 127.A.B.0/24 blocks: each share has its own A values
        for k, count in enumerate(self.shares):
            cmd = [sys.executable, __file__, "--talos-share", f"{k}/{len(self.shares)}", "--clusters", str(count),
                   "--machines", str(self.args.machines), "--time-scale", str(self.args.time_scale),
                   "--first-a", str(self.args.first_a + k * span), "--workdir", str(self.workdir / f"share{k}")]
            self.procs.append(await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**20))
        for k, proc in enumerate(self.procs):
            ready = await self._line(proc)
            if ready is None:
                raise SystemExit(f"Talos share {k} exited with {await proc.wait()} before serving")
            self.machine_count += ready["nodes"]
            for phase, seconds in ready["phases"].items():
                self.timing[phase] = max(self.timing.get(phase, 0.0), seconds)  # the shares start in parallel
            self.documents += json.loads(await asyncio.to_thread(Path(ready["documents"]).read_text))

    @staticmethod
    async def _line(proc: asyncio.subprocess.Process) -> dict[str, Any] | None:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        return json.loads(line) if line else None

    async def _ask(self) -> list[dict[str, Any]]:
        async with self._lock:
            out = []
            for proc in self.procs:
                assert proc.stdin is not None
                proc.stdin.write(b"rpcs\n")
                await proc.stdin.drain()
                answer = await self._line(proc)
                if answer is None:
                    raise SystemExit(f"a Talos share exited with {await proc.wait()}")
                out.append(answer)
            return out

    async def rpcs(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for answer in await self._ask():
            total.update(answer["rpcs"])
        return total

    async def cpu(self) -> float:
        return self_cpu() + sum(float(a["cpu_s"]) for a in await self._ask())

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None and proc.returncode is None:
                proc.stdin.close()  # end of input: the share stops its nodes and exits
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 120)
            except TimeoutError:
                proc.kill()


async def serve_talos_share(args: argparse.Namespace) -> int:
    """One share of ``SharedTalos``: start its nodes, hand over its objects, answer ``rpcs`` until stdin ends."""
    raise_fd_limit()
    count_talos_rpcs()
    cps, workers = min(args.machines, 3), max(args.machines - 3, 0)
    k = args.talos_share.split("/")[0]
    fleet = Fleet(args.clusters, control_planes=cps, workers=workers, time_scale=args.time_scale,
                  objects_in_store=False, name_prefix=f"s{k}c", first_a=args.first_a)
    workdir = Path(args.workdir)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    await fleet.start()
    documents = workdir / "documents.json"
    await asyncio.to_thread(documents.write_text, json.dumps(fleet.documents))
    fleet.documents = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"nodes": fleet.machine_count, "phases": fleet.timing, "documents": str(documents)}),
          flush=True)
    try:
        while await reader.readline():
            print(json.dumps({"rpcs": dict(TALOS_RPCS), "cpu_s": self_cpu()}), flush=True)
    finally:
        await fleet.stop()
    return 0


class Management:
    """Where ichord's objects live: the fleet's simulator, or a real kube-apiserver (``--management real``)."""

    def __init__(self, fleet: LocalTalos | SharedTalos, plane: ControlPlane | None) -> None:
        self.fleet = fleet
        self.plane = plane
        self.kube: KubeClient | None = None
        self.machines: Informer | None = None

    def counts(self) -> tuple[Counter[str], Counter[str], int]:
        if self.plane is None:
            assert isinstance(self.fleet, LocalTalos)
            return kube_counts(self.fleet.fleet.kube.requests)
        return server_counts(str(self.plane.request("GET", "/metrics")))

    def kubeconfig(self, workdir: Path) -> Path:
        if self.plane is None:
            assert isinstance(self.fleet, LocalTalos)
            return self.fleet.fleet.write_kubeconfig(workdir / "kubeconfig")
        return self.plane.admin_kubeconfig

    def ready_reasons(self) -> dict[str, int]:
        if self.machines is None:
            assert isinstance(self.fleet, LocalTalos)
            return self.fleet.fleet.ready_reasons()
        out: dict[str, int] = {}
        for obj in self.machines.cache.values():
            reason = next((f"{c.get('status')}/{c.get('reason')}" for c in (obj.get("status") or {}).get(
                "conditions") or [] if c.get("type") == "Ready"), "")
            out[reason] = out.get(reason, 0) + 1
        return out

    async def create_objects(self, concurrency: int = 16) -> None:
        """The fleet's objects through the real API (namespace first), ``concurrency`` requests at a time."""
        assert self.kube is not None
        kube = self.kube
        # A POST the client retried after a timeout (a loaded machine) may have landed the first time.
        with contextlib.suppress(AlreadyExists):
            await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": self.fleet.namespace}})
        limiter = asyncio.Semaphore(concurrency)

        async def create(doc: dict[str, Any]) -> None:
            group = "/api/v1" if doc["apiVersion"] == "v1" else f"/apis/{doc['apiVersion']}"
            plural = {"Secret": "secrets", "TalosCluster": "talosclusters", "TalosMachine": "talosmachines"}[
                doc["kind"]]
            async with limiter, contextlib.AsyncExitStack() as stack:
                stack.enter_context(contextlib.suppress(AlreadyExists))
                await kube.raw("POST", f"{group}/namespaces/{self.fleet.namespace}/{plural}", body=doc)

        await asyncio.gather(*(create(d) for d in self.fleet.documents))


#: The daemon's own counters read around the idle window (its /metrics): what woke its steps, its watch restarts,
#: and the Kubernetes requests it sent by verb and status (a real server's own count includes the server's traffic).
DAEMON_COUNTERS = ("ichord_actor_steps_total", "ichord_watch_restarts_total",
                   "ichord_kube_request_duration_seconds_count")
DAEMON_REQUESTS = "kube_request_duration_seconds_count"


def daemon_counters(workdir: Path) -> Counter[str]:
    """The daemon's step causes and watch restarts so far, by label set (empty when /metrics does not answer)."""
    out: Counter[str] = Counter()
    try:
        port = int((workdir / "port").read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return out
    for line in text.splitlines():
        if line.startswith(DAEMON_COUNTERS):
            series, _, value = line.rpartition(" ")
            out[series.removesuffix("_total").removeprefix("ichord_")] += int(float(value))
    return out


def daemon_requests(counters: Counter[str]) -> int:
    """The Kubernetes requests the daemon counted itself sending (every verb, every status)."""
    return sum(v for k, v in counters.items() if k.startswith(DAEMON_REQUESTS))


def per_minute(after: Counter[str], before: Counter[str], seconds: float) -> dict[str, float]:
    delta = after - before
    return {k: round(v * 60 / seconds, 2) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])}


def emit(kind: str, **data: Any) -> None:
    print(json.dumps({"bench": "idle", "figure": kind, **data}), flush=True)


# ---- the daemon -------------------------------------------------------------------------------

def start_daemon(management: Management, workdir: Path, args: argparse.Namespace
                 ) -> tuple[subprocess.Popen[bytes], Path]:
    fleet = management.fleet
    kubeconfig = management.kubeconfig(workdir)
    log_path = workdir / "daemon.log"
    env = {**os.environ, "ICHORD_TIME_SCALE": str(args.time_scale)}
    env.pop("KUBECONFIG", None)
    profile = ["-m", "cProfile", "-o", args.daemon_profile] if args.daemon_profile else []
    cmd = [sys.executable, *profile, "-m", "ichord.cli", "run", "--kubeconfig", str(kubeconfig),
           "--controller-namespace",
           fleet.namespace, "--identity", "bench", "--metrics-addr", "127.0.0.1:0",
           "--port-file", str(workdir / "port"), "--force", "--log-level", args.log_level]
    if args.resync is not None:
        cmd += ["--resync", str(args.resync)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, log_path


async def stop_daemon(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        for _ in range(300):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=10)


def log_events(log_path: Path) -> dict[str, int]:
    """How often the daemon logged each warning or error event (crashes, timeouts) so far."""
    out: Counter[str] = Counter()
    with log_path.open(errors="replace") as f:
        for line in f:
            if '"level": "warning"' in line or '"level": "error"' in line:
                with contextlib.suppress(ValueError, KeyError):
                    out[json.loads(line)["event"]] += 1
    return dict(out)


async def wait_converged(management: Management, proc: subprocess.Popen[bytes], t0: float, limit: float,
                         log_path: Path, progress_every: float = 30.0) -> tuple[float, dict[str, float]]:
    """Seconds until every machine is True/Converged, and when 25/50/90% of them were."""
    total = management.fleet.machine_count
    marks = {0.25: -1.0, 0.5: -1.0, 0.9: -1.0}
    next_progress = progress_every
    while True:
        reasons = management.ready_reasons()
        done = reasons.get("True/Converged", 0)
        elapsed = time.perf_counter() - t0
        for frac, at in marks.items():
            if at < 0 and done >= frac * total:
                marks[frac] = round(elapsed, 2)
        if done == total:
            return elapsed, {f"p{int(f * 100)}_s": v for f, v in marks.items()}
        if proc.poll() is not None:
            emit("converge_incomplete", seconds=round(elapsed, 1), converged=done, machines=total,
                 ready_reasons=reasons, daemon_exit=proc.returncode, daemon_log_warnings=log_events(log_path))
            raise SystemExit(f"the daemon exited with {proc.returncode} before converging; see {log_path}")
        if elapsed > next_progress or elapsed > limit:
            next_progress += progress_every
            emit("progress" if elapsed <= limit else "converge_incomplete", seconds=round(elapsed, 1),
                 converged=done, machines=total, ready_reasons=reasons, daemon_cpu_s=round(proc_cpu(proc.pid), 1),
                 sim_cpu_s=round(self_cpu(), 1),
                 daemon=proc_status(proc.pid), daemon_log_warnings=log_events(log_path))
        if elapsed > limit:
            raise SystemExit(f"not converged after {limit:g} s: {reasons}; see {log_path}")
        await asyncio.sleep(0.25)


# ---- the run ----------------------------------------------------------------------------------

async def bench(args: argparse.Namespace) -> int:
    cps = min(args.machines, 3)
    workers = max(args.machines - 3, 0)
    params = {"clusters": args.clusters, "machines": args.machines, "control_planes": cps, "workers": workers,
              "idle_seconds": args.idle_seconds, "time_scale": args.time_scale,
              "resync": args.resync if args.resync is not None else f"default x{args.time_scale:g}",
              "settle": args.settle, "fd_limit": raise_fd_limit(), "cpus": os.cpu_count(),
              "management": args.management}
    count_talos_rpcs()
    t_fleet = time.perf_counter()
    real = args.management == "real"
    shares = min(args.talos_processes or -(-args.clusters * args.machines // NODES_PER_SHARE), args.clusters)
    params["talos_processes"] = shares
    with tempfile.TemporaryDirectory(prefix="ichord-bench-idle-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        fleet: LocalTalos | SharedTalos
        if shares > 1 and real:
            fleet = SharedTalos(args.clusters, shares, args, workdir)
        elif shares > 1:
            raise SystemExit(f"{args.clusters} x {args.machines} nodes need {shares} Talos processes, which only "
                             "--management real supports (the simulator's API serves from this process)")
        else:
            fleet = LocalTalos(Fleet(args.clusters, control_planes=cps, workers=workers, first_a=args.first_a,
                                     time_scale=args.time_scale, objects_in_store=not real))
        proc: subprocess.Popen[bytes] | None = None
        management = Management(fleet, ControlPlane.from_tools(workdir / "apiserver") if real else None)
        try:
            await fleet.start()
            phases = {k: round(v, 2) for k, v in fleet.timing.items()}
            if management.plane is not None:
                t_plane = time.perf_counter()
                await asyncio.to_thread(management.plane.start)
                await asyncio.to_thread(management.plane.establish_crds, DEFAULT_CRD_DIR)
                management.kube = await from_kubeconfig(management.plane.admin_kubeconfig, timing=Timing())
                await management.create_objects()
                management.machines = Informer(management.kube, Resource(GROUP, VERSION, "talosmachines"),
                                               timing=Timing())
                watching = asyncio.ensure_future(management.machines.run())
                await management.machines.wait_synced()
                phases["apiserver_and_objects"] = round(time.perf_counter() - t_plane, 2)
            emit("start", params=params, seconds=round(time.perf_counter() - t_fleet, 2),
                 phases=phases, nodes=fleet.machine_count, sim_rss_kib=proc_status(os.getpid())["VmRSS"])
            kube0 = management.counts()
            rpc0 = await fleet.rpcs()
            sim_cpu0 = await fleet.cpu()
            t0 = time.perf_counter()
            proc, log_path = start_daemon(management, workdir, args)
            converge_s, marks = await wait_converged(management, proc, t0, args.converge_timeout, log_path)
            kube1 = management.counts()
            rpc1 = await fleet.rpcs()
            converge_requests = dict(kube1[0] - kube0[0])
            converge_by_resource = dict(kube1[1] - kube0[1])
            emit("converge", params=params, seconds=round(converge_s, 2), **marks,
                 daemon_cpu_s=round(proc_cpu(proc.pid), 2), sim_cpu_s=round(await fleet.cpu() - sim_cpu0, 2),
                 daemon=proc_status(proc.pid), kube_requests=converge_requests,
                 kube_by_resource=converge_by_resource, talos_rpcs=dict(rpc1 - rpc0),
                 kube_source="kube-apiserver /metrics" if real else "simulator request log",
                 daemon_log_warnings=log_events(log_path))

            await asyncio.sleep(args.settle)
            k_a, rpc_a, cpu_a, sim_a, t_a = management.counts(), await fleet.rpcs(), \
                proc_cpu(proc.pid), await fleet.cpu(), time.perf_counter()
            daemon_a = daemon_counters(workdir)
            rss: list[int] = []
            cpu_samples: list[float] = []  # CPU % over each 5 s: shows the drift-resync bursts
            last_cpu, last_t = cpu_a, t_a
            while time.perf_counter() - t_a < args.idle_seconds:
                await asyncio.sleep(min(5.0, args.idle_seconds))
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon exited with {proc.returncode} while idle; see {log_path}")
                rss.append(proc_status(proc.pid)["VmRSS"])
                now_cpu, now_t = proc_cpu(proc.pid), time.perf_counter()
                cpu_samples.append(round(100 * (now_cpu - last_cpu) / (now_t - last_t), 1))
                last_cpu, last_t = now_cpu, now_t
            k_b, rpc_b, cpu_b, sim_b, t_b = management.counts(), await fleet.rpcs(), \
                proc_cpu(proc.pid), await fleet.cpu(), time.perf_counter()
            window = t_b - t_a
            daemon_b = daemon_counters(workdir)
            status = proc_status(proc.pid)
            still = management.ready_reasons()
            idle = {"window_s": round(window, 1), "daemon_rss_mib": round(status["VmRSS"] / 1024, 1),
                    "daemon_rss_mib_min_max": [round(min(rss) / 1024, 1), round(max(rss) / 1024, 1)],
                    "daemon_peak_rss_mib": round(status["VmHWM"] / 1024, 1), "daemon_threads": status["Threads"],
                    "daemon_cpu_s": round(cpu_b - cpu_a, 3),
                    "daemon_cpu_pct": round(100 * (cpu_b - cpu_a) / window, 2),
                    "daemon_cpu_pct_max_5s": max(cpu_samples), "daemon_cpu_pct_5s": cpu_samples,
                    "daemon_fds": open_fds(proc.pid), "sim_cpu_pct": round(100 * (sim_b - sim_a) / window, 2),
                    "kube_requests_total": k_b[2] - k_a[2],
                    "kube_per_min": round((k_b[2] - k_a[2]) * 60 / window, 2),
                    "kube_per_min_by_verb": per_minute(k_b[0], k_a[0], window),
                    "kube_per_min_by_resource": per_minute(k_b[1], k_a[1], window),
                    "talos_rpcs_per_min": round(sum((rpc_b - rpc_a).values()) * 60 / window, 2),
                    "talos_rpcs_per_min_by_method": per_minute(rpc_b, rpc_a, window),
                    "daemon_steps_and_watch_restarts_per_min": per_minute(
                        Counter({k: v for k, v in daemon_b.items() if not k.startswith(DAEMON_REQUESTS)}),
                        daemon_a, window),
                    "daemon_kube_per_min": round(daemon_requests(daemon_b - daemon_a) * 60 / window, 2),
                    "daemon_kube_per_min_by_verb": per_minute(
                        Counter({k.removeprefix(DAEMON_REQUESTS): v for k, v in daemon_b.items()
                                 if k.startswith(DAEMON_REQUESTS)}),
                        Counter({k.removeprefix(DAEMON_REQUESTS): v for k, v in daemon_a.items()
                                 if k.startswith(DAEMON_REQUESTS)}), window),
                    "ready_reasons_after": still, "daemon_log_warnings": log_events(log_path)}
            emit("idle", params=params, **idle)
            summary = {"clusters": args.clusters, "machines": args.machines, "management": args.management,
                       "converge_s": round(converge_s, 2),
                       "converge_daemon_cpu_s": round(cpu_a, 1),
                       "converge_requests": sum(converge_requests.values()),
                       "converge_lists": converge_requests.get("list", 0),
                       "converge_lists_of_operations": converge_by_resource.get("list talosoperations", 0),
                       "converge_writes": sum(converge_requests.get(v, 0) for v in WRITE_VERBS),
                       "idle_writes": sum((k_b[0] - k_a[0]).get(v, 0) for v in WRITE_VERBS),
                       "rss_mib": idle["daemon_rss_mib"], "idle_cpu_pct": idle["daemon_cpu_pct"],
                       "kube_per_min": idle["kube_per_min"], "daemon_kube_per_min": idle["daemon_kube_per_min"],
                       "converge_daemon_kube_requests": daemon_requests(daemon_a),
                       "talos_rpcs_per_min": idle["talos_rpcs_per_min"],
                       "idle_steps_per_min": round(sum(v for k, v in (daemon_b - daemon_a).items()
                                                       if k.startswith("actor_steps")) * 60 / window, 2),
                       "daemon_fds": idle["daemon_fds"]}
            emit("summary", **summary)
            # Idle means converged still: a machine that fell out of it in the window voids the figures.
            benchkit.require({**summary, "converged_after_idle": still.get("True/Converged", 0)},
                             ("converge_s", "rss_mib", "daemon_fds"),
                             equal={"converged_after_idle": fleet.machine_count})
            return 0
        finally:
            if management.machines is not None:
                watching.cancel()
            if management.kube is not None:
                await management.kube.close()
            if proc is not None:
                code = await stop_daemon(proc)
                if code not in (0, -signal.SIGTERM):
                    print(f"daemon exited with {code}", file=sys.stderr)
            t_stop = time.perf_counter()
            await fleet.stop()
            if management.plane is not None:
                management.plane.stop()
            print(f"# fleet stopped in {time.perf_counter() - t_stop:.1f} s", file=sys.stderr)


def main() -> int:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the JSON figures only
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", type=int, default=10)
    p.add_argument("--machines", type=int, default=4, help="machines per cluster (3 control planes + workers)")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="the measured idle window")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after convergence before the window")
    p.add_argument("--time-scale", type=float, default=1.0, help="ICHORD_TIME_SCALE and the simulators' scale")
    p.add_argument("--resync", type=float, default=None, help="the daemon's --resync (default: its own, 300 s)")
    p.add_argument("--converge-timeout", type=float, default=900.0)
    p.add_argument("--log-level", default="info", help="the daemon's --log-level")
    p.add_argument("--management", choices=("sim", "real"), default="sim",
                   help="where ichord's objects live: the simulator, or a real kube-apiserver (scripts/tools.sh)")
    p.add_argument("--daemon-profile", help="run the daemon under cProfile, writing the stats here at its exit")
    p.add_argument("--workdir", help="keep the kubeconfig and daemon.log here (default: a temporary directory)")
    p.add_argument("--talos-processes", type=int, default=0,
                   help=f"serve the Talos nodes from this many child processes (default: one per "
                        f"{NODES_PER_SHARE} nodes; more than one needs --management real)")
    p.add_argument("--talos-share", help=argparse.SUPPRESS)  # k/n: this process is share k of SharedTalos
    p.add_argument("--first-a", type=int, default=FLEET_FIRST_A,
                   help="the nodes' first 127.A.0.0 block (a second run beside another: pick one above its blocks)")
    args = benchkit.parse_args(p, SMOKE)
    if args.clusters < 1 or args.machines < 1 or args.idle_seconds <= 0:
        p.error("--clusters, --machines and --idle-seconds must be positive")
    if args.talos_share:
        return asyncio.run(serve_talos_share(args))
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return asyncio.run(bench(args))
        except ControlPlaneError as exc:
            print(f"{benchkit.name()}: no figures for --management real: {exc}", file=sys.stderr, flush=True)
            return 1
    return 130


if __name__ == "__main__":
    sys.exit(main())
