"""The compatibility tier's harness: a simulated Talos cluster served from a thread of its own (its own event
loop), and ``talos-compat-<contract>`` (tools/talos-compat: Talos's own Go client, built by scripts/tools.sh)
run against it one case at a time, so each test reads the cluster's state before and after its call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from ichord.contract import VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.sim.talos.build import node_specs
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.node import SimNode
from ichord.sim.talos.testing import fast_timings
from tests.real import tools

T = TypeVar("T")
CLUSTER_NAME = "sim"
CASE_TIMEOUT = 60.0


class ServedCluster:
    """A SimCluster (3 control planes, 1 worker on 127.0.0.x, any free port) running on a thread's loop."""

    def __init__(self, bundle: SecretsBundle, contract: VersionContract, first: int, workdir: Path) -> None:
        self.bundle = bundle
        self.contract = contract
        self.first = first
        self.workdir = workdir
        self.bundle_path = workdir / "secrets.yaml"
        bundle.save(self.bundle_path)
        self.talosconfig = workdir / "talosconfig"
        self.loop = asyncio.new_event_loop()
        self.cluster = SimCluster(contract, fast_timings())
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"sim-talos-{contract}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        specs = node_specs(self.bundle, self.contract, 3, 1, first=self.first, port=0, name=CLUSTER_NAME)
        self.run(self.cluster.start(specs))

    def stop(self) -> None:
        try:
            self.run(self.cluster.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def run(self, coro: Awaitable[T], timeout: float = CASE_TIMEOUT) -> T:
        """Run ``coro`` on the cluster's loop and wait for it."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(timeout)

    def read(self, fn: Callable[[], T]) -> T:
        """``fn()`` evaluated on the cluster's loop (the simulator's state is only touched from there)."""
        async def call() -> T:
            return fn()
        return self.run(call())

    def node(self, name: str) -> SimNode:
        return self.cluster.nodes[name]

    @property
    def endpoint(self) -> str:
        return self.node("cp-1").endpoint

    def binary(self) -> Path | None:
        return tools.tool(f"talos-compat-v{self.contract.major}.{self.contract.minor}")

    def ip(self, name: str) -> str:
        return self.node(name).ip

    def call(self, op: str, *, node: str | None = None, nodes: list[str] | None = None, cred: str = "admin",
             timeout: float = 30.0, trigger: Callable[[], Any] | None = None,
             ready: Callable[[], bool] | None = None, **args: Any) -> dict[str, Any]:
        """One case through Talos's Go client; its JSON result (``ok``, ``code``, ``message``, ``result``).
        ``trigger`` runs on the cluster's loop once ``ready()`` holds there (the client's stream is open)."""
        binary = self.binary()
        assert binary is not None
        case: dict[str, Any] = {"id": op, "op": op, "cred": cred, "args": {**args, "timeout": timeout}}
        if node is not None:
            case["node"] = node
        if nodes is not None:
            case["nodes"] = nodes
        batch = {"bundle": str(self.bundle_path), "clusterName": CLUSTER_NAME, "endpoint": self.endpoint,
                 "talosconfig": str(self.talosconfig), "cases": [case]}
        proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        if trigger is not None:
            asyncio.run_coroutine_threadsafe(_when(ready or (lambda: True), trigger), self.loop)
        try:
            stdout, stderr = proc.communicate(json.dumps(batch), timeout=timeout + 30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, f"{binary.name} failed ({proc.returncode}): {stderr[-2000:]}"
        result: dict[str, Any] = json.loads(stdout.splitlines()[-1])
        return result


async def _when(ready: Callable[[], bool], action: Callable[[], Any]) -> None:
    for _ in range(int(CASE_TIMEOUT / 0.02)):
        if ready():
            result = action()
            if asyncio.iscoroutine(result):
                await result
            return
        await asyncio.sleep(0.02)
