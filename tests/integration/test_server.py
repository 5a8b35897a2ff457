"""/metrics, /healthz and /readyz over real HTTP."""

from __future__ import annotations

import aiohttp
import anyio
import pytest

from ichord import metrics
from ichord.server import HealthServer

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_endpoints() -> None:
    synced = False
    server = HealthServer(ready_checks={"informers": lambda: synced}, heartbeat_interval=0.01, stall_after=5)
    metrics.LEADER.set(1)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve, "127.0.0.1", 0)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 503
                assert "informers" in await r.text()
            synced = True
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
                assert r.status == 200
                assert "ichord_leader 1.0" in text
                assert "ichord_certificate_expiry_timestamp_seconds" in text
                assert "ichor_certificate_expiry_timestamp_seconds" in text  # the deprecated alias, one release
        tg.cancel_scope.cancel()


async def test_healthz_fails_when_the_loop_stalls() -> None:
    import time

    server = HealthServer(heartbeat_interval=0.01, stall_after=0.05, stall_hold=5)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve, "127.0.0.1", 0)
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
        time.sleep(0.2)  # noqa: ASYNC251 - block the loop on purpose (a stalled reconcile)
        await anyio.sleep(0.05)
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 503
        tg.cancel_scope.cancel()
