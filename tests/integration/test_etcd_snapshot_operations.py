"""Issue 26: an operation that reboots control planes takes an etcd snapshot first when its TalosCluster names a
destination (spec.etcdSnapshots), exactly once across kills, and its plan says where it went.

The order is read from the Talos simulator's history: the ``etcd_snapshot`` a control plane served comes before
the first ``reboot_requested`` and before any configuration was applied. Kills are the in-process twins of the
failpoints (etcd-snapshot.marker.after, etcd-snapshot.taken.before): the step dies there and the next step,
reading everything afresh, must neither take a second snapshot nor skip it."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations import etcd_snapshot
from ichord.operations.outcome import Blocked, Done
from ichord.pki.bundle import SecretsBundle
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import Crash, Driver, add_clients, driving

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
Obj = dict[str, Any]


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.02) as e:
        add_clients(e)
        yield e


async def _destination(env: SimEnvironment, driver: Driver, directory: Path, retain: int = 5) -> None:
    await crds.clusters(driver.kube).patch(env.namespace, env.cluster_name, {"spec": {"etcdSnapshots": {
        "path": str(directory), "retain": retain}}})


def listing(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def _history(env: SimEnvironment) -> list[dict[str, Any]]:
    return list(env.talos.history.events)


def _first(events: list[dict[str, Any]], kind: str) -> int:
    return next(e["seq"] for e in events if e["kind"] == kind)


async def test_an_etcd_rotation_leaves_one_snapshot_before_its_first_reboot(
        env: SimEnvironment, driver: Driver, tmp_path: Path) -> None:
    await _destination(env, driver, tmp_path)
    await driver.create(targets=["etcd"])
    assert isinstance(await driver.run(max_steps=1500), Done)
    files = listing(tmp_path)
    assert len(files) == 1 and re.fullmatch(rf"{env.namespace}_{env.cluster_name}_\d{{8}}T\d{{6}}Z_rotate\.db",
                                            files[0].name), files
    events = _history(env)
    snapshots = [e for e in events if e["kind"] == "etcd_snapshot"]
    assert len(snapshots) == 1 and "-cp-" in str(snapshots[0]["node"])
    assert snapshots[0]["seq"] < _first(events, "reboot_requested") and snapshots[0]["seq"] < _first(events, "apply")
    op = await driver.get()
    record = op["status"]["etcdSnapshot"]
    data = files[0].read_bytes()
    assert record["state"] == "Taken" and record["path"] == str(files[0])
    assert (record["size"], record["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert record["machine"] == snapshots[0]["node"]
    # The plan says where it went, and its warning names the directory instead of a command to run by hand.
    assert op["status"]["plan"]["etcdSnapshot"] == {"directory": str(tmp_path), "retain": 5, "file": str(files[0])}
    assert any(f"an etcd snapshot is taken to {tmp_path}" in w for w in op["status"]["plan"]["warnings"])
    await driver.recorder.drain()
    store = env.management.store
    taken = [e for e in store.list(store.resolve("", "v1", "events"), env.namespace)[0]
             if e.get("reason") == names.EventReason.ETCD_SNAPSHOT_TAKEN]
    assert len(taken) == 1 and taken[0]["type"] == "Normal" and str(files[0]) in taken[0]["message"]


async def test_without_a_destination_nothing_is_taken_and_the_plan_names_the_command(
        env: SimEnvironment, driver: Driver) -> None:
    await driver.create(targets=["etcd"], paused=True)
    await driver.step()
    plan = (await driver.get())["status"]["plan"]
    assert "etcdSnapshot" not in plan
    assert any(f"ichord cluster etcd-snapshot {env.cluster_name} -n {env.namespace} -f FILE" in w
               for w in plan["warnings"])
    assert [e for e in _history(env) if e["kind"] == "etcd_snapshot"] == []


@pytest.mark.parametrize("point", ["etcd-snapshot.marker.after", "etcd-snapshot.taken.before"])
async def test_a_kill_around_the_snapshot_takes_exactly_one(env: SimEnvironment, tmp_path: Path, point: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fired: list[str] = []

    def die_once(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            raise Crash(f"killed at {name}")

    monkeypatch.setattr(etcd_snapshot, "failpoint", die_once)
    async with driving(env) as driver:
        await _destination(env, driver, tmp_path)
        await driver.create(targets=["etcd"])
        assert isinstance(await driver.run(max_steps=1500), Done)
        op = await driver.get()
    assert fired == [point]
    files = listing(tmp_path)
    assert len(files) == 1 and op["status"]["etcdSnapshot"]["path"] == str(files[0])  # no partial file left
    served = [e for e in _history(env) if e["kind"] == "etcd_snapshot"]
    assert len(served) == 1  # taken once: the step after the kill recorded the file it found, or took the missing one
    assert served[0]["seq"] < _first(_history(env), "reboot_requested")


async def test_an_unusable_destination_blocks_before_anything_changes(
        env: SimEnvironment, driver: Driver, tmp_path: Path) -> None:
    await _destination(env, driver, tmp_path / "not-mounted")
    await driver.create(targets=["etcd"])
    outcome = await driver.run(until=lambda o: (o.get("status") or {}).get("phase") == "Paused")
    assert isinstance(outcome, Blocked)
    cond = find((await driver.get())["status"]["conditions"], names.CA_ROTATION)
    assert cond["reason"] == "Blocked" and "spec.etcdSnapshots.path" in cond["message"]
    assert "mount a volume there" in cond["message"]
    events = _history(env)
    assert not [e for e in events if e["kind"] in ("apply", "reboot_requested", "etcd_snapshot")]


async def test_retention_keeps_the_clusters_newest(env: SimEnvironment, driver: Driver, tmp_path: Path) -> None:
    older = [tmp_path / f"{env.namespace}_{env.cluster_name}_2026010{i}T000000Z_old.db" for i in range(1, 4)]
    # Another cluster's (its name starting like this one's: names may hold dots), and a file named otherwise.
    others = [tmp_path / f"{env.namespace}_another_20260101T000000Z_old.db",
              tmp_path / f"{env.namespace}_{env.cluster_name}.prod_20260101T000000Z_old.db",
              tmp_path / f"{env.namespace}_{env.cluster_name}_keep-me.db"]
    for path in [*older, *others]:
        path.write_bytes(b"x")
    await _destination(env, driver, tmp_path, retain=2)
    await driver.create(targets=["etcd"])
    await driver.run(max_steps=1500, until=lambda o: ((o.get("status") or {}).get("etcdSnapshot") or {}).get(
        "state") == "Taken")
    kept = [p.name for p in listing(tmp_path)]
    new = (await driver.get())["status"]["etcdSnapshot"]["path"]
    assert kept == sorted([older[-1].name, Path(new).name, *(o.name for o in others)])


async def test_a_config_rollout_that_reboots_control_planes_takes_one_first(
        bundle: SecretsBundle, tmp_path: Path) -> None:
    from ichord.settings import Timing
    from tests.integration._config_world import REBOOT_PATCH, world_on

    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=1) as env, \
            contextlib.asynccontextmanager(world_on)(env, Timing().scaled(0.01)) as world:
        if True:
            await crds.clusters(world.kube).patch(env.namespace, env.cluster_name, {"spec": {
                "etcdSnapshots": {"path": str(tmp_path)}}})
            await world.patch_cluster([REBOOT_PATCH])

            async def reported() -> bool:
                return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 4

            await world.run_until(reported, what="4 machines reporting rebootPaths")
            since = len(env.talos.history.events)
            await crds.operations(world.kube).create(env.namespace, {"metadata": {"name": "roll"}, "spec": {
                "clusterRef": {"name": env.cluster_name}, "kind": "config"}})

            async def finished() -> bool:
                return ((await world.op("roll")).get("status") or {}).get("phase") in ("Completed", "Failed")

            await world.run_until(finished, what="the rollout finished")
            op = await world.op("roll")
    assert op["status"]["phase"] == "Completed", op["status"]
    events = env.talos.history.events[since:]
    served = [e for e in events if e["kind"] == "etcd_snapshot"]
    assert len(served) == 1 and served[0]["seq"] < _first(events, "apply") < _first(events, "reboot_requested")
    (file,) = listing(tmp_path)
    assert op["status"]["etcdSnapshot"]["path"] == str(file) == op["status"]["plan"]["etcdSnapshot"]["file"]
    assert file.name.startswith(f"{env.namespace}_{env.cluster_name}_") and file.name.endswith("_roll.db")
