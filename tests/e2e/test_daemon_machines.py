"""`ichord run` as a subprocess against `ichord sim`'s environment: the machine reconciler end to end."""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.leases import get_lease
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually, machine_ready

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SAFE_PATCH = "machine:\n  sysctls:\n    net.core.somaxconn: \"65535\"\n"
REBOOT_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"
APISERVER_PATCH = "apiVersion: v1alpha1\nkind: KubeNetworkConfig\ndnsDomain: e2e.example\n"


@pytest.fixture
async def kube(sim_env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(sim_env.kubeconfig)
    yield client
    await client.close()


async def _patch_cluster(kube: KubeClient, env: SimEnvironment, patches: list[str]) -> None:
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": patches}})


def _rendered_hash(env: SimEnvironment, machine: str, patches: list[str]) -> str:
    from dataclasses import replace

    from ichord.render.generate import render

    cluster = replace(env.cluster_inputs(), patches=tuple(patches))
    return render(env.bundle, cluster, env.machine_inputs(machine)).hash()  # type: ignore[arg-type]


def _no_hash_applied_twice(env: SimEnvironment) -> None:
    for m in env.machine_names:
        counts = Counter(h for h, _mode in env.applies(m))
        assert all(c == 1 for c in counts.values()), (m, counts)


async def test_converge_safe_patch_reboot_and_apiserver_reports(sim_env: SimEnvironment, kube: KubeClient,
                                                               tmp_path: Path) -> None:
    env = sim_env
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await eventually(lambda: all_ready(kube, env), what="every machine converged")
        assert all(env.applies(m) == [] for m in env.machine_names)  # nothing to apply at the start

        # a safe patch reaches every node with exactly one apply each, of exactly the render
        await _patch_cluster(kube, env, [SAFE_PATCH])
        await eventually(lambda: all(len(env.applies(m)) == 1 for m in env.machine_names), what="one apply each")
        for m in env.machine_names:
            assert env.applies(m) == [(_rendered_hash(env, m, [SAFE_PATCH]), "NO_REBOOT")]
        await eventually(lambda: all_ready(kube, env), what="converged again")

        # a reboot-requiring patch is reported with its paths and never applied
        await _patch_cluster(kube, env, [SAFE_PATCH, REBOOT_PATCH])
        await eventually(lambda: all_ready(kube, env, ("RebootRequired",)), what="RebootRequired everywhere")
        ready = await machine_ready(kube, env, env.machine_names[0])
        assert ready is not None
        assert ready["_status"]["rebootPaths"] == ["KernelModuleConfig br_netfilter (added)"]
        assert "KernelModuleConfig br_netfilter (added)" in ready["message"]
        assert ready["status"] == "False"
        assert all(len(env.applies(m)) == 1 for m in env.machine_names)

        # an API-server-restart patch: reported on control planes, applied on the worker
        await _patch_cluster(kube, env, [SAFE_PATCH, APISERVER_PATCH])
        workers = [m for m in env.machine_names if "worker" in m]
        cps = [m for m in env.machine_names if m not in workers]

        async def split() -> bool:
            for m in cps:
                r = await machine_ready(kube, env, m)
                if r is None or r["reason"] != "APIServerRestartRequired":
                    return False
            for m in workers:
                r = await machine_ready(kube, env, m)
                if r is None or r["reason"] != "Converged":
                    return False
            return True

        await eventually(split, what="control planes report, the worker applies")
        cp_ready = await machine_ready(kube, env, cps[0])
        assert cp_ready is not None and cp_ready["_status"]["apiServerRestartPaths"] == ["KubeNetworkConfig.dnsDomain"]
        for m in cps:
            assert len(env.applies(m)) == 1
        for m in workers:
            assert env.applies(m)[-1][0] == _rendered_hash(env, m, [SAFE_PATCH, APISERVER_PATCH])
        _no_hash_applied_twice(env)

        # events were posted for the transitions
        events = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events")
        reasons = {e["reason"] for e in events["items"]}
        assert {"ConfigApplied", "RebootRequired", "APIServerRestartRequired"} <= reasons
    finally:
        rc = await daemon.stop()
    assert rc == 0, daemon.log()[-3000:]
    log = daemon.log()
    for secret in env.bundle.secret_values():
        assert secret not in log


async def test_unreachable_node_recovers_by_itself(sim_env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    env = sim_env
    worker = next(m for m in env.machine_names if "worker" in m)
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await eventually(lambda: all_ready(kube, env))
        await env.set_unreachable(worker)
        await _patch_cluster(kube, env, [SAFE_PATCH])  # wakes the actor now rather than at the resync

        async def unreachable() -> bool:
            r = await machine_ready(kube, env, worker)
            return r is not None and r["reason"] == "Unreachable" and r["status"] == "False"

        await eventually(unreachable, what="Unreachable")
        await env.set_unreachable(worker, False)
        await eventually(lambda: all_ready(kube, env), what="recovered")
        assert len(env.applies(worker)) == 1
        _no_hash_applied_twice(env)
    finally:
        assert await daemon.stop() == 0


async def test_readyz_metrics_and_leader_takeover_after_sigkill(sim_env: SimEnvironment, kube: KubeClient,
                                                               tmp_path: Path) -> None:
    env = sim_env
    await env.management.go_down()  # informers cannot sync: not ready
    first = Daemon(env, tmp_path, "replica-a")
    second = Daemon(env, tmp_path, "replica-b")
    try:
        await eventually(lambda: first.port is not None and second.port is not None, what="ports")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{first.port}/readyz") as r:
                assert r.status == 503
            async with http.get(f"http://127.0.0.1:{first.port}/healthz") as r:
                assert r.status == 200
            await env.management.come_up()

            async def ready(port: int | None) -> bool:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    return r.status == 200

            await eventually(lambda: ready(first.port), what="readyz")
            await eventually(lambda: all_ready(kube, env))
            lease = await eventually(lambda: get_lease(kube, env.namespace, "ichord-leader"))
            leader, other = (first, second) if lease.holder == "replica-a" else (second, first)
            async with http.get(f"http://127.0.0.1:{leader.port}/metrics") as r:
                text = await r.text()
            assert "ichord_leader 1.0" in text
            # the expiry phase published every CA of the cluster, in status and as a metric
            for ca in ("talos", "kubernetes", "kubernetes-aggregator", "etcd"):
                assert f'certificate="{ca}"' in text
            assert f'name="{env.cluster_name}"' in text
            cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
            names = sorted(c["name"] for c in cluster["status"]["certificates"])
            assert names == ["etcd", "kubernetes", "kubernetes-aggregator", "talos"]
            conds = {c["type"]: c for c in cluster["status"]["conditions"]}
            assert conds["CertificatesExpiring"]["status"] == "False"
            assert "ichord_kube_request_duration_seconds_count" in text
            assert "ichord_actor_step_duration_seconds_count" in text

        leader.kill()  # SIGKILL: no release, the lease must run out
        await _patch_cluster(kube, env, [SAFE_PATCH])

        async def taken_over() -> bool:
            rec = await get_lease(kube, env.namespace, "ichord-leader")
            return rec is not None and rec.holder == other.name

        await eventually(taken_over, what="the other replica leads")
        await eventually(lambda: all(len(env.applies(m)) == 1 for m in env.machine_names), what="applied")
        await eventually(lambda: all_ready(kube, env))
        _no_hash_applied_twice(env)
    finally:
        for d in (first, second):
            await d.stop()


async def test_bad_input_is_reported_and_nothing_applied(sim_env: SimEnvironment, kube: KubeClient,
                                                         tmp_path: Path) -> None:
    env = sim_env
    # a machine pointing at a cluster that does not exist
    await crds.machines(kube).create(env.namespace, {
        "metadata": {"name": "stray"},
        "spec": {"clusterRef": {"name": "nope"}, "role": "worker", "address": "127.0.0.1", "approved": True},
    })
    # the bundle Secret missing
    await kube.raw("DELETE", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}")
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        async def stray() -> bool:
            r = await machine_ready(kube, env, "stray")
            return r is not None and r["reason"] == "ClusterNotFound"

        await eventually(stray, what="ClusterNotFound")

        async def secret_missing() -> bool:
            obj = await crds.clusters(kube).get(env.namespace, env.cluster_name)
            conds = (obj.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["reason"] == "SecretNotFound" for c in conds)

        await eventually(secret_missing, what="SecretNotFound on the cluster")
        await eventually(lambda: all_ready(kube, env, ("BundleInvalid",)), what="machines say why")
        # a patch that does not apply, with the Secret back: RenderFailed, nothing applied anywhere
        await kube.raw("POST", f"/api/v1/namespaces/{env.namespace}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": env.secret_name},
            "stringData": {"secrets.yaml": env.bundle.to_yaml()}})
        # one machine's own patch does not apply: that machine says so, the others are served
        broken = env.machine_names[-1]
        await crds.machines(kube).patch(env.namespace, broken, {"spec": {"patches": ["machine: [oops\n"]}})

        async def one_broken() -> bool:
            for m in env.machine_names:
                r = await machine_ready(kube, env, m)
                want = "RenderFailed" if m == broken else "Converged"
                if r is None or r["reason"] != want:
                    return False
            return True

        await eventually(one_broken, what="one machine RenderFailed, the others Converged")
        # a cluster patch that does not apply: RenderFailed everywhere, nothing applied anywhere
        await _patch_cluster(kube, env, ["machine: [this is not a mapping\n"])
        await eventually(lambda: all_ready(kube, env, ("RenderFailed",)), what="RenderFailed")
        assert all(env.applies(m) == [] for m in env.machine_names)
        events = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events")
        reasons = {e["reason"] for e in events["items"]}
        assert {"SecretNotFound", "ClusterNotFound", "RenderFailed"} <= reasons
    finally:
        assert await daemon.stop() == 0


def _talos_connections(pid: int, endpoints: set[tuple[str, int]]) -> int:
    """The process's established TCP connections to any of ``endpoints`` (its fds matched in /proc/net/tcp)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        host_hex, port_hex = remote.split(":")
        host = socket.inet_ntoa(bytes.fromhex(host_hex)[::-1])
        if state == "01" and inode in inodes and (host, int(port_hex, 16)) in endpoints:
            count += 1
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
async def test_an_idle_cluster_holds_no_talos_connection(sim_env: SimEnvironment, kube: KubeClient,
                                                         tmp_path: Path) -> None:
    """Converged and waiting for the drift resync (minutes), an actor closes its Talos channels: a channel per
    machine held for nothing cost 1.6 GiB and 4,000 fds at 4,000 machines."""
    env = sim_env
    endpoints = {(ep.rsplit(":", 1)[0], int(ep.rsplit(":", 1)[1])) for ep in env.endpoints.values()}
    daemon = Daemon(env, tmp_path, "replica-0", resync=600.0)  # the next step is far beyond talos_channel_keep
    try:
        await eventually(lambda: all_ready(kube, env), what="every machine converged")
        await eventually(lambda: _talos_connections(daemon.proc.pid, endpoints) == 0, within=10,
                         what="no Talos connection left open")
        # A change wakes the actor: it dials again and converges the patch.
        await _patch_cluster(kube, env, [SAFE_PATCH])
        await eventually(lambda: all(len(env.applies(m)) == 1 for m in env.machine_names), what="one apply each")
        await eventually(lambda: all_ready(kube, env), what="converged again")
    finally:
        assert await daemon.stop() == 0, daemon.log()[-3000:]
