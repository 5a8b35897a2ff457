"""`ichord sim talos`: a simulated Talos cluster on loopback, with its state served as JSON.

GET /state (nodes, etcd, history), GET /history?since=N, GET /healthz, and
POST /nodes/{name}/faults with a JSON object of Faults fields for fault injection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TextIO

from aiohttp import web

from ichord.contract import VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.sim.talos.build import node_specs
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.node import Faults, Timings


@dataclass(frozen=True)
class SimOptions:
    bundle: SecretsBundle
    contract: VersionContract
    control_planes: int
    workers: int
    port: int = 50000
    ip_prefix: str = "127.0.0."
    first: int = 11
    state_host: str = "127.0.0.1"
    state_port: int | None = None
    time_scale: float = 1.0


def scaled(scale: float) -> Timings:
    base = Timings()
    return Timings(reboot=base.reboot * scale, kubelet_restart=base.kubelet_restart * scale,
                   kubelet_restart_lag=base.kubelet_restart_lag * scale,
                   apiserver_restart_delay=base.apiserver_restart_delay * scale,
                   apiserver_ready_delay=base.apiserver_ready_delay * scale)


def state_app(cluster: SimCluster, state_of: Callable[[], dict[str, Any]] | None = None) -> web.Application:
    """``state_of`` replaces what GET /state serves (the combined environment adds its Kubernetes side)."""
    async def state(_: web.Request) -> web.Response:
        doc = state_of() if state_of is not None else cluster.state()
        return web.json_response(doc, dumps=lambda o: json.dumps(o, default=str))

    async def history(request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        return web.json_response(cluster.history.since(since), dumps=lambda o: json.dumps(o, default=str))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"nodes": {n: node.up for n, node in cluster.nodes.items()}})

    async def faults(request: web.Request) -> web.Response:
        node = cluster.nodes.get(request.match_info["name"])
        if node is None:
            raise web.HTTPNotFound(text=f"no node {request.match_info['name']!r}")
        body = await request.json()
        known = {f.name for f in fields(Faults)}
        if not isinstance(body, dict) or set(body) - known:
            raise web.HTTPBadRequest(text=f"expected a JSON object with keys among {sorted(known)}")
        for key, value in body.items():
            if key == "unreachable":
                await node.set_unreachable(bool(value))
            elif key == "etcd_unhealthy":
                node.set_etcd_unhealthy(bool(value))
            else:
                setattr(node.faults, key, value)
        cluster.history.record("fault", node.name, **body)
        return web.json_response(vars(node.faults))

    app = web.Application()
    app.add_routes([web.get("/state", state), web.get("/history", history), web.get("/healthz", healthz),
                    web.post("/nodes/{name}/faults", faults)])
    return app


async def serve(opts: SimOptions, out: TextIO = sys.stdout, stop: asyncio.Event | None = None) -> int:
    cluster = SimCluster(opts.contract, scaled(opts.time_scale))
    specs = node_specs(opts.bundle, opts.contract, opts.control_planes, opts.workers, ip_prefix=opts.ip_prefix,
                       first=opts.first, port=opts.port)
    await cluster.start(specs)
    runner: web.AppRunner | None = None
    try:
        lines: list[dict[str, Any]] = [{"node": n.name, "type": n.view.machine_type, "endpoint": n.endpoint}
                                       for n in cluster.nodes.values()]
        if opts.state_port is not None:
            runner = web.AppRunner(state_app(cluster))
            await runner.setup()
            site = web.TCPSite(runner, opts.state_host, opts.state_port)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            lines.append({"state": f"http://{opts.state_host}:{port}/state"})
        for line in lines:
            print(json.dumps(line), file=out, flush=True)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
        await cluster.close()
    return 0
