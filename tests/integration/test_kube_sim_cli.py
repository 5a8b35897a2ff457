"""`ichord sim kube` as a process: serves, writes a usable kubeconfig, stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
import pytest

from ichord.kube.client import from_kubeconfig
from ichord.kube.crds import clusters

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.mark.parametrize("over", [False, True], ids=["new-file", "over-an-old-one-with-force"])
async def test_sim_kube_command(tmp_path: Path, over: bool) -> None:
    kc = tmp_path / "sim.kubeconfig"
    cmd = [sys.executable, "-m", "ichord.cli", "sim", "kube", "--port", "0", "--kubeconfig", str(kc)]
    if over:  # a kubeconfig an earlier run left: replaced only when asked (docs/decisions.md#cli-files)
        kc.write_text("stale\n")
        cmd.append("--force")
    async with await anyio.open_process(cmd) as proc:
        assert proc.stdout is not None
        with anyio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive()
        info = json.loads(line)
        assert info["kubeconfig"] == str(kc) and info["url"].startswith("https://127.0.0.1:")
        assert kc.stat().st_mode & 0o777 == 0o600
        kube = await from_kubeconfig(kc)
        try:
            items, rv = await clusters(kube).list_objects()  # the chart's CRDs are served
            assert items == [] and rv
        finally:
            await kube.close()
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            assert await proc.wait() == 0


def test_refuses_a_non_loopback_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ichord.cli import main

    assert main(["sim", "kube", "--host", "10.0.0.1", "--kubeconfig", str(tmp_path / "kc")]) == 2
    assert "not a loopback address" in capsys.readouterr().err
