"""`ichord cluster status` along a rotation that `ichord run` carries out: each time it names what to run next.

The daemon and the commands are subprocesses against a simulated 3+1 cluster; the operator only follows
what `cluster status` prints: the unpause patch of a plan-only operation, the credentials hand-off in
AwaitingCredentials, and the bundle export once the rotation completed.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import DAEMON_TIME_SCALE, Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
OP = "rotate"


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="separate")


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(env.kubeconfig)
    yield client
    await client.close()


async def _ichord(env: SimEnvironment, *args: str) -> tuple[int, str, str]:
    environ = {**os.environ, "ICHORD_TIME_SCALE": DAEMON_TIME_SCALE}
    environ.pop("KUBECONFIG", None)
    done = await anyio.run_process([sys.executable, "-m", "ichord.cli", *args, "--kubeconfig", str(env.kubeconfig)],
                                   check=False, env=environ)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def _status(env: SimEnvironment) -> str:
    code, out, err = await _ichord(env, "cluster", "status", env.cluster_name, "-n", env.namespace)
    assert code == 0 and err == "", err
    assert "PRIVATE KEY" not in out and "BEGIN" not in out
    return out


def _next(out: str) -> str:
    """The command the report names for the one operation under way, or for the cluster."""
    lines = [line.strip() for line in out.splitlines()]
    found = [line.removeprefix("next: ") for line in lines if line.startswith("next: ")]
    found += [line.removeprefix("Next: ") for line in lines if line.startswith("Next: ")]
    assert len(found) == 1, out
    return found[0]


async def _op(kube: KubeClient, env: SimEnvironment) -> dict[str, Any]:
    return await crds.operations(kube).get(env.namespace, OP)


async def _stage_is(kube: KubeClient, env: SimEnvironment, stage: str) -> bool:
    return bool(((await _op(kube, env)).get("status") or {}).get("caRotation", {}).get("stage") == stage)


async def _phase_is(kube: KubeClient, env: SimEnvironment, phase: str) -> bool:
    return bool(((await _op(kube, env)).get("status") or {}).get("phase") == phase)


async def _stale(kube: KubeClient, env: SimEnvironment) -> bool:
    obj = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    cond = find((obj.get("status") or {}).get("conditions"), names.BUNDLE_BACKUP_STALE)
    return bool(cond and cond.get("status") == "True")


async def test_status_leads_the_operator_through_a_rotation(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        out = await _status(env)
        for m in env.machine_names:
            assert any(line.split()[:4] == [m, line.split()[1], "True", "Converged"]
                       for line in out.splitlines() if line.strip().startswith(m)), out
        assert "none under way" in out and "CertificatesExpiring" in out
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        for cert in cluster["status"]["certificates"]:
            assert cert["fingerprint"] in out and cert["notAfter"] in out

        # Plan only: status names the patch that starts it; the operator runs exactly that (as kubectl would).
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": OP}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "paused": True}})
        await eventually(lambda: _phase_is(kube, env, "Pending"), within=20, what="the plan written")
        command = shlex.split(_next(await _status(env)))
        # (with the kubeconfig status was run with, so that it works pasted as printed)
        assert command[:8] == ["kubectl", "--kubeconfig", str(env.kubeconfig), "-n", env.namespace, "patch", "top",
                               OP], command
        assert command[8:] == ["--type", "merge", "-p", '{"spec":{"paused":false}}'], command
        await crds.operations(kube).patch(env.namespace, OP, {"spec": {"paused": False}})

        # AwaitingCredentials: status names the hand-off; running it lets the rotation go on.
        await eventually(lambda: _stage_is(kube, env, "AwaitingCredentials"), within=60, what="AwaitingCredentials")
        out = await _status(env)
        assert "stage AwaitingCredentials" in out and "waiting for: AwaitingCredentials:" in out
        command = shlex.split(_next(out))
        assert command == ["ichord", "cluster", "credentials", env.cluster_name, "-n", env.namespace,
                           "--kubeconfig", str(env.kubeconfig), "--acknowledge"]
        (tmp_path / "creds").mkdir()  # a directory the operator names must exist
        code, _, err = await _ichord(env, *command[1:], "-d", str(tmp_path / "creds"), "--wait", "120")
        assert code == 0, err

        # Completed: the bundle export is what is left to do.
        await eventually(lambda: _phase_is(kube, env, "Completed"), within=120, what="the rotation completed")
        await eventually(lambda: _stale(kube, env), within=20, what="BundleBackupStale raised")
        out = await _status(env)
        assert "none under way" in out and f"last finished: {OP} ca-rotation Completed" in out
        command = shlex.split(_next(out))
        assert command == ["ichord", "cluster", "bundle-export", env.cluster_name, "-n", env.namespace,
                           "--kubeconfig", str(env.kubeconfig)]
        code, _, err = await _ichord(env, *command[1:], "-f", str(tmp_path / "bundle.yaml"))
        assert code == 0, err
        await eventually(lambda: _not(_stale(kube, env)), within=20, what="BundleBackupStale lowered")
        assert "Next:" not in await _status(env)
    finally:
        assert await daemon.stop() == 0


async def _not(value: Any) -> bool:
    return not await value
