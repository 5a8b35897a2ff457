"""Issue 12, the operator's path with the daemon as a subprocess: the README's recipe survives a rotation, the
probes tell the truth, and mistakes (a cluster that does not exist, a bundle Secret created late) get feedback."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import KubeError
from ichord.kube.leases import get_lease
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import DAEMON_TIME_SCALE, Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SCALE = float(DAEMON_TIME_SCALE)
X509 = ("certificate is not trusted", "CERTIFICATE_VERIFY_FAILED", "certificate verify failed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReadmeReplica:
    """`ichord run --kubeconfig OUT --namespace ichord-system --metrics-addr ...`: the README's recipe, nothing more."""

    def __init__(self, env: SimEnvironment, workdir: Path, name: str, *, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.port = _free_port()
        self.log_path = workdir / f"{name}.log"
        self._log = self.log_path.open("ab")
        environ = {**os.environ, "ICHORD_TIME_SCALE": DAEMON_TIME_SCALE, "HOME": str(workdir)}
        environ.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ichord.cli", "run", "--kubeconfig", str(env.kubeconfig), "--controller-namespace",
             env.namespace, "--metrics-addr", f"127.0.0.1:{self.port}", *extra],
            stdout=self._log, stderr=subprocess.STDOUT, env=environ)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def identity(self) -> str | None:
        for line in self.lines():
            if line.get("event") == "became leader":
                return str(line.get("identity"))
        return None

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    async def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with anyio.move_on_after(15):
                while self.proc.poll() is None:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
        self._log.close()


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="self")


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    """The test's own client: whatever CA the simulator serves now (it plays kubectl with fresh credentials)."""
    client = await from_kubeconfig(env.kubeconfig, trust=lambda: [env.kube.ca_pem])
    yield client
    await client.close()


async def _rotate(kube: KubeClient, env: SimEnvironment, within: float = 150.0,
                  phases: set[str] | None = None) -> dict[str, Any]:
    """The README's kubectl recipe: create the rotation, acknowledge in AwaitingCredentials, wait for the end."""
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate-cas"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
    with anyio.fail_after(within):
        while True:
            try:
                op = await crds.operations(kube).get(env.namespace, "rotate-cas")
                status = op.get("status") or {}
                if (status.get("caRotation") or {}).get("stage") == "AwaitingCredentials" and not (
                        op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION):
                    await crds.operations(kube).patch(env.namespace, "rotate-cas", {"metadata": {"annotations": {
                        names.CREDENTIALS_HANDOFF_ANNOTATION: handoff_token(status["caRotation"]["certificates"])}}})
            except KubeError:  # the API server restarts for the new CAs: look again
                await anyio.sleep(0.05)
                continue
            if phases is not None and status.get("phase"):
                phases.add(str(status["phase"]))
            if status.get("phase") in ("Completed", "Failed"):
                return op
            await anyio.sleep(0.05)


def _switched(env: SimEnvironment) -> bool:
    return any(rec["kind"] == "serving_ca_switch" for rec in env.kube.outages)


async def test_the_readme_recipe_survives_a_rotation_with_no_trust_flag(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    first = ReadmeReplica(env, tmp_path, "replica-0")
    replicas = [first]
    try:
        await eventually(first.identity, within=30, what="the first replica leads")
        replicas.append(ReadmeReplica(env, tmp_path, "replica-1"))
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await eventually(lambda: all(r.readyz() == 200 for r in replicas), within=30, what="both ready")
        leader = first.identity()
        before = await get_lease(kube, env.namespace, names.LEADER_LEASE)
        assert before is not None and before.holder == leader

        phases: set[str] = set()
        op = await _rotate(kube, env, phases=phases)
        assert op["status"]["phase"] == "Completed", op["status"]
        # A healthy rotation waits as InProgress: never Paused, no Warning on the operation (issue 12).
        assert "Paused" not in phases, phases
        events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        assert not [e for e in events if e["type"] == "Warning" and e["involvedObject"]["name"] == "rotate-cas"]
        # Messages for humans: no object reprs, no exception chains, in any Event or condition.
        texts = [e.get("message") or "" for e in events] + [
            c.get("message") or "" for c in op["status"].get("conditions") or []]
        assert not [t for t in texts if "0x" in t or "caused by" in t], texts
        assert _switched(env)
        for r in replicas:
            assert not [line for line in r.log().splitlines() if any(m in line for m in X509)], r.name
            assert r.proc.poll() is None and r.readyz() == 200, r.name
            started = [line for line in r.lines() if line.get("event") == "trust pool on"]
            assert started and "certificate-authority-data" in started[0]["base"], r.name
        after = await get_lease(kube, env.namespace, names.LEADER_LEASE)
        assert after is not None and (after.holder, after.transitions) == (leader, before.transitions)
        # /metrics of the leader: the operation's info series, its stage durations, the Talos RPC durations.
        metrics = first.metrics()
        assert ('ichord_operation_info{cluster="demo",kind="ca-rotation",namespace="ichord-system",'
                'operation="rotate-cas",phase="Completed",stage="Done"} 1.0') in metrics
        for stage in ("Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing"):
            assert (f'ichord_operation_stage_duration_seconds_count{{kind="ca-rotation",stage="{stage}"}} 1.0'
                    in metrics), stage
        assert 'ichord_talos_rpc_duration_seconds_count{code="OK",method="ApplyConfiguration"}' in metrics
        assert "ichord_reconcile_outcomes_total" in metrics and "process_resident_memory_bytes" in metrics
        # The new CA outlives the processes: the trust file under ~/.ichord/trust holds it for a restart.
        assert list((tmp_path / ".ichord" / "trust").glob("*/kubernetes-ca.crt"))
    finally:
        for r in replicas:
            await r.stop()


async def test_without_the_pool_the_replicas_lose_the_api_and_readyz_says_so(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    replicas = [ReadmeReplica(env, tmp_path, f"replica-{i}", extra=("--no-trust-pool",)) for i in range(2)]
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await eventually(lambda: all(r.readyz() == 200 for r in replicas), within=30, what="both ready")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_rotate, kube, env, 150.0)
            await eventually(lambda: _switched(env), within=120, what="the API server switched its CA")
            grace = Timing().scaled(SCALE).api_unready_grace
            # Within the grace (plus one probe interval and the kube call timeout's slack) /readyz turns 503.
            for r in replicas:
                await eventually(lambda r=r: r.readyz() == 503, within=grace * 4 + 10, what=f"{r.name} unready")
                assert any(m in r.log() for m in X509), r.name
            tg.cancel_scope.cancel()
    finally:
        for r in replicas:
            await r.stop()


async def test_a_missing_cluster_and_a_late_bundle_secret_get_feedback_within_seconds(
        make_sim_env: MakeSimEnv, tmp_path: Path) -> None:
    env = await make_sim_env(management_api="separate")
    async with await from_kubeconfig(env.kubeconfig) as kube:
        daemon = Daemon(env, tmp_path, "d0")
        try:
            await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
            # A TalosOperation naming a cluster that does not exist (a typo).
            await crds.operations(kube).create(env.namespace, {"metadata": {"name": "typo"}, "spec": {
                "clusterRef": {"name": "demoo"}, "kind": "ca-rotation", "paused": True}})

            async def typo_reported() -> dict[str, Any] | None:
                op = await crds.operations(kube).get(env.namespace, "typo")
                cond = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION)
                return op if cond and cond["reason"] == "ClusterNotFound" else None

            op = await eventually(typo_reported, within=20, what="ClusterNotFound on the operation")
            assert op["status"]["phase"] == "Pending" and "demoo" in op["status"]["message"]
            events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
            assert [e["type"] for e in events if e["reason"] == "ClusterNotFound"
                    and e["involvedObject"]["name"] == "typo"] == ["Warning"]

            # A cluster whose bundle Secret is created after it: expiry follows the Secret's event, long before
            # the 5-minute (scaled) retry of an unreadable bundle would have read it again.
            cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
            await crds.clusters(kube).create(env.namespace, {"metadata": {"name": "demoo"}, "spec": {
                **cluster["spec"], "secretsRef": {"name": "demoo-secrets"}}})

            async def ready_reason(name: str) -> str | None:
                obj = await crds.clusters(kube).get(env.namespace, name)
                cond = find((obj.get("status") or {}).get("conditions"), names.READY)
                return str(cond["reason"]) if cond else None

            await eventually(lambda: _is(ready_reason("demoo"), "SecretNotFound"), within=20, what="SecretNotFound")
            secret = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}")
            await kube.raw("POST", f"/api/v1/namespaces/{env.namespace}/secrets", body={
                "metadata": {"name": "demoo-secrets", "labels": {names.BUNDLE_LABEL: "true"}},
                "type": "Opaque", "data": {names.SECRETS_KEY: secret["data"][names.SECRETS_KEY]}})
            retry = Timing().scaled(SCALE).expiry_retry

            async def certificates() -> list[Any]:
                obj = await crds.clusters(kube).get(env.namespace, "demoo")
                return list((obj.get("status") or {}).get("certificates") or [])

            start = time.monotonic()
            await eventually(certificates, within=retry / 2, what="status.certificates after the Secret appeared")
            print(f"status.certificates {time.monotonic() - start:.2f} s after the Secret was created "
                  f"(the unreadable-bundle retry is {retry:g} s)")
            # The operation that named the missing cluster is re-checked now that it exists: the plan is written.
            await eventually(lambda: _planned(kube, env), within=20, what="the typo operation planned")
            assert base64.b64decode(secret["data"][names.SECRETS_KEY])  # the test copied a real bundle
        finally:
            await daemon.stop()


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _planned(kube: KubeClient, env: SimEnvironment) -> bool:
    op = await crds.operations(kube).get(env.namespace, "typo")
    cond = find((op.get("status") or {}).get("conditions"), names.CA_ROTATION)
    return bool(cond and cond["reason"] == "Planned")
