"""`ichord sim` as a real subprocess, and `sim kube` / `sim talos` still reachable beside it."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from ichord import cli
from ichord.sim.combined import free_loopback_block

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

#: ichord.cli lists ichord.sim.cli once the lead wires it in; until then the tests add it themselves.
ENTRY = ("import sys; from ichord import cli; "
         "cli.COMMAND_MODULES = tuple(dict.fromkeys((*cli.COMMAND_MODULES, 'ichord.sim.cli'))); "
         "sys.exit(cli.main())")


def parser(order: str) -> argparse.ArgumentParser:
    """ichord's parser with ichord.sim.cli registered before or after the single simulators."""
    modules = [m for m in cli.COMMAND_MODULES if m != "ichord.sim.cli"]
    modules = ["ichord.sim.cli", *modules] if order == "first" else [*modules, "ichord.sim.cli"]
    original = cli.COMMAND_MODULES
    cli.COMMAND_MODULES = tuple(modules)  # type: ignore[assignment]
    try:
        return cli.build_parser()
    finally:
        cli.COMMAND_MODULES = original


@pytest.mark.parametrize("order", ["first", "last"])
def test_plain_sim_runs_the_environment_and_sim_kube_and_sim_talos_stay(order: str) -> None:
    from ichord.sim import cli as sim_cli
    from ichord.sim.kube import cli as kube_cli
    from ichord.sim.talos import cli as talos_cli

    p = parser(order)
    args = p.parse_args(["sim", "--control-planes", "1", "--workers", "2", "--management-api", "separate"])
    assert args.func is sim_cli.run and (args.control_planes, args.workers) == (1, 2)
    assert args.management_api == "separate" and args.simulator is None
    assert p.parse_args(["sim", "kube", "--port", "0"]).func is kube_cli.run
    assert p.parse_args(["sim", "talos", "--bundle", "b.yaml"]).func is talos_cli.run
    with pytest.raises(SystemExit):
        p.parse_args(["sim", "--management-api", "elsewhere"])


async def _line(proc: asyncio.subprocess.Process) -> dict[str, object]:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), timeout=20)
    assert raw, "ichord sim ended before printing its endpoints"
    doc: dict[str, object] = json.loads(raw)
    return doc


async def test_ichord_sim_subprocess_prints_endpoints_serves_state_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    prefix = free_loopback_block(range(10, 15))
    kubeconfig = tmp_path / "ichord.kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, "sim", "--ip-prefix", prefix, "--kubeconfig", str(kubeconfig),
        "--state-port", "0", "--time-scale", "0.02",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        lines = [await _line(proc) for _ in range(7)]  # API, kubeconfig, 4 nodes, state
        assert lines[0] == {"kubernetes_api": f"https://{prefix}11:6443", "role": "managed"}
        assert lines[1]["kubeconfig"] == str(kubeconfig) and kubeconfig.stat().st_mode & 0o777 == 0o600
        assert [ln["endpoint"] for ln in lines[2:6]] == [f"{prefix}{i}:50000" for i in range(11, 15)]
        state_url = str(lines[6]["state"])
        async with aiohttp.ClientSession() as http, http.get(state_url) as resp:
            state = await resp.json()
        assert sorted(state["talos"]["nodes"]) == ["demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1"]
        assert state["kubernetes"]["managed"]["url"] == f"https://{prefix}11:6443"
        assert [r["status"] for r in state["kubernetes"]["managed"]["node_readiness"]] == ["True"] * 4
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert rc == 0, err
    assert "stopped" in err
