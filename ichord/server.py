"""The HTTP endpoints of every replica: /metrics, /healthz (event-loop heartbeat), /readyz.

/healthz fails while the event loop has recently been blocked: a heartbeat task measures how late
each of its wake-ups is, and a lag over ``stall_after`` keeps /healthz at 503 for ``stall_hold``
seconds (a loop blocked for good does not answer at all, which the probe's timeout catches).
/readyz answers 200 only once every readiness check (the informers' synced signals) passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ichord.errors import IchordError, network_cause
from ichord.metrics import REGISTRY

ReadyCheck = Callable[[], bool]


class ListenError(IchordError):
    """The health server cannot bind its address (``ichord run`` stops: exit 2, one log line)."""


class HealthServer:
    def __init__(
        self,
        *,
        registry: CollectorRegistry = REGISTRY,
        ready_checks: dict[str, ReadyCheck] | None = None,
        heartbeat_interval: float = 1.0,
        stall_after: float = 10.0,
        stall_hold: float = 60.0,
    ) -> None:
        self._registry = registry
        self.ready_checks: dict[str, ReadyCheck] = dict(ready_checks or {})
        self._interval = heartbeat_interval
        self._stall_after = stall_after
        self._stall_hold = stall_hold
        self._stalled_at: float | None = None
        self._worst_lag = 0.0
        self.app = web.Application()
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        if self._stalled_at is not None and time.monotonic() - self._stalled_at < self._stall_hold:
            return web.Response(status=503, text=f"event loop was blocked for {self._worst_lag:.1f}s\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        failing = sorted(name for name, check in self.ready_checks.items() if not check())
        if failing:
            return web.Response(status=503, text="not ready: " + ", ".join(failing) + "\n")
        return web.Response(text="ok\n")

    async def serve(
        self, host: str, port: int, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; reports the bound port (port 0 picks a free one)."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ListenError(f"--metrics-addr {host}:{port}: cannot listen there ({network_cause(exc)}); pass "
                              "another --metrics-addr") from None
        bound = port
        sockets = getattr(site._server, "sockets", None)  # aiohttp exposes the bound socket only here
        if sockets:
            bound = int(sockets[0].getsockname()[1])
        task_status.started(bound)
        try:
            while True:
                expected = time.monotonic() + self._interval
                await anyio.sleep(self._interval)
                lag = time.monotonic() - expected
                if lag > self._stall_after:
                    self._stalled_at, self._worst_lag = time.monotonic(), lag
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
