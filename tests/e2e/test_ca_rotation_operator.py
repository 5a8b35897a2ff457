"""The operator's path through a CA rotation, with `ichord run` and the operator's commands as subprocesses.

One rotation of a simulated 3+1 cluster, driven only as an operator would (kubectl-like API calls and
the `ichord cluster` commands): a stale bundle export first; the plan-only creation; a machine down
blocks the start and nothing is written; an early acknowledgement is dropped on entry to
AwaitingCredentials; `ichord cluster credentials --acknowledge` hands off; `spec.paused` mid-way holds
and resumes; BundleBackupStale is raised, kept by the stale export and lowered by a live one.
"""

from __future__ import annotations

import base64
import os
import stat
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
from ichord.operations.ca_rotation.plan import handoff_token
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


def _secret(env: SimEnvironment) -> dict[str, bytes]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    return {k: base64.b64decode(v) for k, v in obj["data"].items()}


async def _ichord(env: SimEnvironment, *args: str) -> tuple[int, str]:
    environ = {**os.environ, "ICHORD_TIME_SCALE": DAEMON_TIME_SCALE}
    environ.pop("KUBECONFIG", None)
    done = await anyio.run_process([sys.executable, "-m", "ichord.cli", *args, "--kubeconfig", str(env.kubeconfig),
                                    "-n", env.namespace], check=False, env=environ)
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


async def _op(kube: KubeClient, env: SimEnvironment) -> dict[str, Any]:
    return await crds.operations(kube).get(env.namespace, OP)


def _stage(op: dict[str, Any]) -> str:
    return str(((op.get("status") or {}).get("caRotation") or {}).get("stage") or "")


def _ca_condition(op: dict[str, Any]) -> dict[str, Any]:
    return find((op.get("status") or {}).get("conditions"), names.CA_ROTATION) or {}


async def _backup_stale(kube: KubeClient, env: SimEnvironment) -> str:
    obj = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    cond = find((obj.get("status") or {}).get("conditions"), names.BUNDLE_BACKUP_STALE)
    return str(cond["status"]) if cond else ""


async def test_the_operators_path_through_a_rotation(env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        # An export taken before the rotation: it will be stale once the CAs change.
        code, out = await _ichord(env, "cluster", "bundle-export", env.cluster_name, "-o", str(tmp_path / "old.yaml"))
        assert code == 0, out
        before = _secret(env)

        # Plan only: the plan is written and nothing else.
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": OP}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "paused": True}})
        op = await eventually(lambda: _planned(kube, env), within=20, what="status.plan written")
        assert op["status"]["phase"] == "Pending" and not _stage(op)
        assert [m["name"] for m in op["status"]["plan"]["machines"]][:3] == env.machine_names[:3]
        assert _secret(env) == before and not op["metadata"].get("finalizers")

        # A machine down: unpausing is Blocked naming it, and nothing is written.
        down = env.machine_names[1]
        await env.set_unreachable(down)
        await crds.operations(kube).patch(env.namespace, OP, {"spec": {"paused": False}})
        op = await eventually(lambda: _blocked(kube, env), within=20, what="the start blocked")
        assert down in _ca_condition(op)["message"] and not _stage(op)
        assert _secret(env) == before

        # Back up: it starts by itself. The operator acknowledges too early (the right token, in Accepting).
        await env.set_unreachable(down, False)
        op = await eventually(lambda: _at(kube, env, "Accepting"), within=30, what="stage Accepting")
        token = handoff_token(op["status"]["caRotation"]["certificates"])
        await crds.operations(kube).patch(env.namespace, OP, {"metadata": {"annotations": {
            names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        op = await eventually(lambda: _at(kube, env, "AwaitingCredentials"), within=60,
                              what="stage AwaitingCredentials")
        await anyio.sleep(1.0)  # ~20 s scaled: the early acknowledgement was dropped on entry, and it waits
        op = await _op(kube, env)
        assert _stage(op) == "AwaitingCredentials", op["status"]
        assert names.CREDENTIALS_HANDOFF_ANNOTATION not in (op["metadata"].get("annotations") or {})

        # The hand-off, as the operator runs it.
        out_dir = tmp_path / "creds"
        out_dir.mkdir()  # a directory the operator names must exist
        code, out = await _ichord(env, "cluster", "credentials", env.cluster_name, "--acknowledge",
                                  "-o", str(out_dir), "--wait", "120")
        assert code == 0, out
        for name in ("talosconfig", "kubeconfig"):
            assert stat.S_IMODE((out_dir / name).stat().st_mode) == 0o600
            assert str(out_dir / name) in out
        assert "PRIVATE KEY" not in out and "BEGIN" not in out

        # Paused mid-way: it holds in Issuing (no apply), keeps the lock, and resumes where it stopped.
        await eventually(lambda: _at(kube, env, "Issuing"), within=30, what="stage Issuing")
        await crds.operations(kube).patch(env.namespace, OP, {"spec": {"paused": True}})
        op = await eventually(lambda: _reason(kube, env, "Paused"), within=20, what="held by spec.paused")
        held_in = _stage(op)
        applies = sum(len(env.applies(m)) for m in env.machine_names)
        await anyio.sleep(1.0)
        assert sum(len(env.applies(m)) for m in env.machine_names) == applies
        assert _stage(await _op(kube, env)) == held_in
        await crds.operations(kube).patch(env.namespace, OP, {"spec": {"paused": False}})

        op = await eventually(lambda: _ended(kube, env), within=120, what="the rotation ended")
        assert op["status"]["phase"] == "Completed" and _ca_condition(op)["reason"] == "Rotated", op["status"]
        for m in env.machine_names:  # one apply per machine per pass, the pause and the block repeated none
            assert len(env.applies(m)) == 3, (m, env.applies(m))

        # BundleBackupStale: raised, kept by the stale export's annotation, lowered by a live export.
        await eventually(lambda: _is(_backup_stale(kube, env), "True"), within=20, what="BundleBackupStale")
        await anyio.sleep(0.5)
        assert await _backup_stale(kube, env) == "True"
        code, out = await _ichord(env, "cluster", "bundle-export", env.cluster_name, "-o", str(tmp_path / "new.yaml"))
        assert code == 0, out
        await eventually(lambda: _is(_backup_stale(kube, env), "False"), within=20, what="BundleBackupStale lowered")
    finally:
        assert await daemon.stop() == 0


async def _planned(kube: KubeClient, env: SimEnvironment) -> dict[str, Any] | None:
    op = await _op(kube, env)
    return op if (op.get("status") or {}).get("plan") else None


async def _ended(kube: KubeClient, env: SimEnvironment) -> dict[str, Any] | None:
    op = await _op(kube, env)
    return op if (op.get("status") or {}).get("phase") in ("Completed", "Failed") else None


async def _blocked(kube: KubeClient, env: SimEnvironment) -> dict[str, Any] | None:
    op = await _op(kube, env)
    return op if _ca_condition(op).get("reason") == "Blocked" else None


async def _at(kube: KubeClient, env: SimEnvironment, stage: str) -> dict[str, Any] | None:
    op = await _op(kube, env)
    return op if _stage(op) == stage else None


async def _reason(kube: KubeClient, env: SimEnvironment, reason: str) -> dict[str, Any] | None:
    op = await _op(kube, env)
    return op if _ca_condition(op).get("reason") == reason else None


async def _is(value: Any, want: str) -> bool:
    return bool(await value == want)
