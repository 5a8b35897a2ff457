"""Run `ichord run` as a real subprocess against a simulated environment, and read what it did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.sim.combined import SimEnvironment

#: Daemon durations x0.05: lease 6 s / renew 4.5 s / retry 0.5 s, retry-after 1.5 s (a loaded 2-core CI
#: must still renew in time).
DAEMON_TIME_SCALE = "0.05"


class Daemon:
    def __init__(self, env: SimEnvironment, workdir: Path, name: str, *, extra_env: dict[str, str] | None = None,
                 resync: float = 1.0, kubeconfig: Path | None = None, controller_namespace: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        """``controller_namespace``: where the daemon runs (default the environment's namespace, where its objects
        are); ``extra_args``: more ``ichord run`` flags (e.g. the ones a chart's Deployment passes)."""
        self.env = env
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"
        self._log = self.log_path.open("wb")
        # HOME: the trust pool's per-kubeconfig file (~/.ichord/trust) stays inside the test's directory.
        environ = {**os.environ, "ICHORD_TIME_SCALE": DAEMON_TIME_SCALE, "HOME": str(workdir), **(extra_env or {})}
        environ.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ichord.cli", "run", "--kubeconfig", str(kubeconfig or env.kubeconfig),
             "--controller-namespace", controller_namespace or env.namespace, "--identity", name,
             "--metrics-addr", "127.0.0.1:0", "--port-file", str(self.port_file), "--force", "--resync", str(resync),
             "--log-level", "debug", *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=environ,
        )

    @property
    def port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    async def stop(self) -> int:
        # A daemon still starting (importing, before it serves its port) has no SIGTERM handler yet and would die of
        # the signal's default action (-15): give it up to 10 s to show its port, which it writes only once its
        # receiver is in place (daemon.py _run). One that never serves is then stopped all the same.
        with anyio.move_on_after(10):
            while self.proc.poll() is None and self.port is None:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(15):
                while self.proc.poll() is None:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
        self._log.close()
        return int(self.proc.wait(timeout=10))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


async def eventually(pred: Callable[[], Any], within: float = 30.0, what: str = "condition") -> Any:
    """Poll an async or sync predicate until it returns something truthy."""
    try:
        with anyio.fail_after(within):
            while True:
                value = pred()
                if hasattr(value, "__await__"):
                    value = await value
                if value:
                    return value
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for: {what}") from None


async def machine_ready(kube: KubeClient, env: SimEnvironment, name: str) -> dict[str, Any] | None:
    obj = await crds.machines(kube).get(env.namespace, name)
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return {**cond, "_status": obj.get("status")}
    return None


async def all_ready(kube: KubeClient, env: SimEnvironment, reasons: tuple[str, ...] = ("Converged",)) -> bool:
    for name in env.machine_names:
        ready = await machine_ready(kube, env, name)
        if ready is None or ready.get("reason") not in reasons:
            return False
    return True
