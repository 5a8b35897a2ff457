"""Health gates against a real Prometheus and a real Alertmanager (built by scripts/tools.sh from pinned Go modules):
Prometheus scrapes a /metrics this test serves, an alerting rule fires when the test sets its gauge, Prometheus
sends the alert to Alertmanager, and a config rollout on the simulators (the real cluster actor step and registry)
is held before its next node while the alert fires, by both a Prometheus gate (ALERTS) and an Alertmanager gate,
and goes on by itself once the alert resolves. Reboots are read from the simulators' history.

Only the rollout's managed cluster and Talos nodes are simulated; the gates talk HTTP to the real servers."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import REBOOT_PATCH, World, reboots, world_on
from tests.real import tools

pytestmark = pytest.mark.anyio

SCALE = 0.01
TIMING = Timing().scaled(SCALE)
ALERT = "ExampleNodeProblem"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    """The /metrics Prometheus scrapes: one gauge the test sets."""

    problem: int = 0

    async def metrics(self, _request: web.Request) -> web.Response:
        body = f"# TYPE example_node_problem gauge\nexample_node_problem {self.problem}\n"
        return web.Response(text=body, content_type="text/plain")


@dataclass
class Servers:
    prometheus: str
    alertmanager: str


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(f"{url} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never ready:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return _port()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, metrics_port: int) -> Iterator[Servers]:
    reason = tools.missing("prometheus", "alertmanager")
    if reason:
        pytest.skip(reason)
    prometheus, alertmanager = tools.tool("prometheus"), tools.tool("alertmanager")
    assert prometheus is not None and alertmanager is not None
    run = tmp_path_factory.mktemp("prometheus")
    am_port, prom_port = _port(), _port()
    (run / "alertmanager.yml").write_text(
        "route: {receiver: none, group_wait: 0s, group_interval: 1s, repeat_interval: 1h}\n"
        "receivers: [{name: none}]\n")
    (run / "rules.yml").write_text(
        "groups:\n- name: example\n  interval: 1s\n  rules:\n"
        f"  - alert: {ALERT}\n    expr: example_node_problem > 0\n    labels: {{severity: critical}}\n")
    (run / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [rules.yml]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
        f"scrape_configs: [{{job_name: example, static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]}}]\n")
    am_log, prom_log = run / "alertmanager.log", run / "prometheus.log"
    am = _start([str(alertmanager), f"--config.file={run / 'alertmanager.yml'}", f"--storage.path={run / 'am'}",
                 f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="], am_log)
    prom = _start([str(prometheus), f"--config.file={run / 'prometheus.yml'}",
                   f"--storage.tsdb.path={run / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"], prom_log)
    try:
        _wait_ready(f"http://127.0.0.1:{am_port}/-/ready", am, am_log)
        _wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prom, prom_log)
        yield Servers(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}")
    finally:
        for proc in (prom, am):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
async def target(metrics_port: int) -> AsyncIterator[Target]:
    t = Target()
    app = web.Application()
    app.router.add_get("/metrics", t.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", metrics_port)
    await site.start()
    try:
        yield t
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def world(bundle: SecretsBundle) -> AsyncIterator[World]:
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, control_planes=3, workers=1) as env:
        async for w in world_on(env, TIMING):
            yield w


async def _firing(servers: Servers) -> tuple[int, int]:
    """The alert as Prometheus and Alertmanager each see it (firing series, active alerts)."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{servers.prometheus}/api/v1/query",
                               params={"query": f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'}) as resp:
            series = len((await resp.json())["data"]["result"])
        async with session.get(f"{servers.alertmanager}/api/v2/alerts",
                               params=[("active", "true"), ("filter", f'alertname="{ALERT}"')]) as resp:
            alerts = len(await resp.json())
    return series, alerts


async def _until(servers: Servers, want: tuple[int, int]) -> None:
    """Until both servers see the alert as ``want`` (they have no watch to wait on: Prometheus scrapes and
    evaluates every second, so this polls at half of that)."""
    seen = None
    for _ in range(240):
        seen = await _firing(servers)
        if seen == want:
            return
        await anyio.sleep(0.5)
    raise AssertionError(f"(firing series, active alerts) is {seen}, not {want}, after 120 s")


def _cond(obj: dict[str, Any]) -> dict[str, Any]:
    return find((obj.get("status") or {}).get("conditions"), names.CONFIG_ROLLOUT) or {}


async def test_a_firing_alert_holds_the_rollout_before_the_next_node_until_it_resolves(
        servers: Servers, target: Target, world: World) -> None:
    env = world.env
    await crds.clusters(world.kube).patch(env.namespace, env.cluster_name, {"spec": {"health": {"gates": [
        {"name": "no-firing-alert", "prometheus": {"url": servers.prometheus,
                                                   "query": f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'}},
        {"name": "no-critical-alerts", "alertmanager": {"url": servers.alertmanager,
                                                         "matchers": ['severity="critical"']}},
    ]}}})
    await _until(servers, (0, 0))
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 4

    await world.run_until(reported, what="every machine reporting rebootPaths")
    since = len(env.talos.history.events)
    await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "paused": False}})
    first, second = f"{env.cluster_name}-cp-1", f"{env.cluster_name}-cp-2"

    async def first_rebooting() -> bool:
        return ((await world.op("roll")).get("status") or {}).get("roll", {}).get("rebooting") == first

    await world.run_until(first_rebooting, what=f"{first} rebooting")
    target.problem = 1  # the alert fires while the first node reboots; no step runs until both servers see it
    await _until(servers, (1, 1))

    async def held() -> bool:
        return _cond(await world.op("roll")).get("reason") == names.HealthGateReason.FAILING

    await world.run_until(held, steps=4000, what="held by the firing alert")
    op = await world.op("roll")
    assert op["status"]["roll"]["done"] == [first]
    assert op["status"]["phase"] == "Paused"
    verdicts = {g["name"]: g for g in op["status"]["healthGates"]["gates"]}
    assert op["status"]["healthGates"]["target"] == second
    assert not verdicts["no-firing-alert"]["passing"] and "1 series" in verdicts["no-firing-alert"]["message"]
    assert not verdicts["no-critical-alerts"]["passing"] and ALERT in verdicts["no-critical-alerts"]["message"]
    for _ in range(20):
        await world.step()
    assert sum(reboots(env, since).values()) == 1  # held: only the first node rebooted

    target.problem = 0
    await _until(servers, (0, 0))

    async def completed() -> bool:
        return (await world.op("roll")).get("status", {}).get("phase") in ("Completed", "Failed")

    await world.run_until(completed, steps=4000, what="the rollout completed after the alert resolved")
    op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    assert reboots(env, since) == {m: 1 for m in env.machine_names}
    events = env.kube.store.list(env.kube.store.resolve("", "v1", "events"), env.namespace)[0]
    warned = {e["message"].split()[2] for e in events if e.get("reason") == names.HealthGateReason.FAILING}
    passed = {e["message"].split()[2] for e in events if e.get("reason") == names.EventReason.GATE_PASSED}
    assert warned == passed == {"no-firing-alert", "no-critical-alerts"}
