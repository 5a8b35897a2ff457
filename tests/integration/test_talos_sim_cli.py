"""`ichord sim talos` as a process: nodes answer over mutual TLS, the state is served as JSON."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from ichord.contract import V1_14
from ichord.pki.bundle import generate_bundle
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_sim_talos_command(tmp_path: Path) -> None:
    bundle = generate_bundle()
    path = tmp_path / "secrets.yaml"
    bundle.save(path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ichord.cli", "sim", "talos", "--bundle", str(path), "--control-planes", "1",
        "--workers", "1", "--port", "0", "--first-address", "91", "--state-port", "0", "--time-scale", "0.01",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        lines = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for _ in range(3)]
        nodes = {x["node"]: x for x in lines if "node" in x}
        assert {n: x["type"] for n, x in nodes.items()} == {"cp-1": "controlplane", "worker-1": "worker"}
        assert nodes["cp-1"]["endpoint"].startswith("127.0.0.91:")
        state_url = lines[-1]["state"]
        async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=5) as c:
            for x in nodes.values():
                assert (await c.version(x["endpoint"])).tag == "v1.14.5"
            boot = await c.boot_id(nodes["worker-1"]["endpoint"], V1_14)
            await c.reboot(nodes["worker-1"]["endpoint"])
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(state_url) as resp:
                    state = await resp.json()
                if state["nodes"]["worker-1"]["boot_id"] != boot and state["nodes"]["worker-1"]["up"]:
                    break
                await asyncio.sleep(0.02)
            assert state["nodes"]["worker-1"]["boots"] == 2
            assert [e["kind"] for e in state["history"] if e["node"] == "worker-1"][-2:] == ["reboot", "up"]
            assert state["etcd"]["quorum"] is True
            assert state["nodes"]["cp-1"]["cas"]["os"]["can_issue"] is True
            base = state_url.rsplit("/", 1)[0]
            async with http.post(f"{base}/nodes/worker-1/faults", json={"unreachable": True}) as resp:
                assert resp.status == 200
            async with http.post(f"{base}/nodes/worker-1/faults", json={"bogus": 1}) as resp:
                assert resp.status == 400
            async with http.get(f"{base}/healthz") as resp:
                assert (await resp.json())["nodes"] == {"cp-1": True, "worker-1": False}
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 10)
    assert rc == 0
