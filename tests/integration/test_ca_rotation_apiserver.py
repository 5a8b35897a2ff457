"""One kube-apiserver restart at a time (docs/decisions.md#ca-rotation-passes point 3): a pass that rotates the
Kubernetes CA applies the next control plane, and verifies the stage, only once the control plane before it
runs a new kube-apiserver container whose own /readyz answers 200. Against the simulators."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ichord.operations.ca_rotation import apiserver_instances
from ichord.operations.outcome import Done
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.run import scaled
from tests.integration._apiserver_history import overlapping_restarts
from tests.integration._ca_rotation_driver import TIMING, Crash, Driver, at, driving

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02
# A restart in the simulator begins 60 ms after the apply; "unchanged for a minute" must not pass before it.
GATE_TIMING = replace(TIMING, ca_apiserver_unchanged=5.0)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    # kube-apiserver is not ready for 0.4 s after its restart: long enough that back-to-back applies overlap.
    timings = replace(scaled(SCALE), apiserver_ready_delay=0.4)
    async with SimEnvironment(bundle=bundle, time_scale=SCALE, timings=timings) as e:
        yield e


@pytest.fixture
async def driver(env: SimEnvironment) -> AsyncIterator[Driver]:
    async with driving(env, timing=GATE_TIMING) as d:
        yield d


def _control_planes(env: SimEnvironment) -> list[str]:
    return [n for n in env.machine_names if env.node(n).is_control_plane]


def _not_ready(env: SimEnvironment) -> list[str]:
    return [n for n in _control_planes(env) if not env.node(n).apiserver_ready]


def _stage(op: dict[str, Any]) -> str:
    return str(((op.get("status") or {}).get("caRotation") or {}).get("stage") or "")


async def test_kube_apiservers_restart_one_at_a_time_and_every_stage_waits_for_them(
        env: SimEnvironment, driver: Driver) -> None:
    await driver.create()
    stage, changes = "", 0

    def watch(op: dict[str, Any]) -> bool:
        nonlocal stage, changes
        if _stage(op) != stage:
            stage, changes = _stage(op), changes + 1
            # A stage moves on only when every control plane's kube-apiserver is back and ready.
            assert not _not_ready(env), (stage, _not_ready(env))
        return False

    assert isinstance(await driver.run(until=watch, max_steps=800), Done)
    assert changes >= 5
    events = env.talos.history.events
    restarts = [e for e in events if e["kind"] == "apiserver_restart"]
    assert len(restarts) >= 3 * len(_control_planes(env))  # every control plane, every pass
    assert overlapping_restarts(events) == []
    assert not _not_ready(env)


@pytest.mark.parametrize(("fault", "shown"), [("500", "/readyz answered 500"), ("hang", "/readyz did not answer")])
async def test_a_readyz_that_fails_holds_the_next_control_plane(env: SimEnvironment, driver: Driver, fault: str,
                                                                shown: str) -> None:
    cps = _control_planes(env)
    assert env.readyz is not None
    env.readyz.faults[cps[0]] = fault  # "hang": never answers, the probe times out
    await driver.create()

    def held(op: dict[str, Any]) -> bool:
        return any(m.get("state") == "APIServerRestarting" and shown in m.get("message", "")
                   for m in (op.get("status") or {}).get("machines") or [])

    await driver.run(until=held)
    op = await driver.get()
    assert _stage(op) == "Accepting" and op["status"]["phase"] == "InProgress"  # a wait, not a fault
    assert any(c["type"] == "CARotation" and c["reason"] == "VerifyingPass" and cps[0] in c["message"]
               for c in op["status"]["conditions"])
    applied = {endpoint for endpoint, _ in driver.applies}
    assert len(applied) == 1  # only the first control plane was applied; the others wait for its /readyz
    for _ in range(3):
        await driver.step()
    assert len({endpoint for endpoint, _ in driver.applies}) == 1
    del env.readyz.faults[cps[0]]
    assert isinstance(await driver.run(max_steps=800), Done)
    assert overlapping_restarts(env.talos.history.events) == []


async def test_a_kube_apiserver_that_never_restarts_is_given_the_minute_then_asked_readyz(
        env: SimEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    cps = _control_planes(env)
    node = env.node(cps[1])

    async def never() -> None:
        return None

    # (1.5 s: above the one-second resolution of appliedAt.)
    # In Accepting the second control plane's kube-apiserver keeps its container (a stage that changed nothing
    # it loads, as far as the pass can tell); from Issuing on it restarts as usual.
    monkeypatch.setattr(node, "_restart_apiserver", never)
    async with driving(env, timing=replace(GATE_TIMING, ca_apiserver_unchanged=1.5)) as d:
        await d.create(targets=["kubernetes"])
        seen: list[str] = []

        def note(op: dict[str, Any]) -> bool:
            seen.extend(m.get("message", "") for m in (op.get("status") or {}).get("machines") or []
                        if m.get("name") == cps[1] and m.get("state") == "APIServerRestarting")
            return _stage(op) != "Accepting"

        await d.run(until=note)
        assert any("container unchanged" in m for m in seen)
        assert not any("/readyz" in m for m in seen)  # ready all along: only the minute was waited
        monkeypatch.undo()
        assert isinstance(await d.run(max_steps=800), Done)


async def test_killed_between_the_record_and_the_apply_the_pass_records_again_and_applies_once(
        env: SimEnvironment, driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    crashes = 0

    def crash(point: str) -> None:
        nonlocal crashes
        if point == "ca-rotation.apiserver.recorded" and crashes < 2:
            crashes += 1
            raise Crash(point)

    monkeypatch.setattr(apiserver_instances, "failpoint", crash)
    await driver.create()
    assert isinstance(await driver.run(max_steps=800), Done)
    assert crashes == 2
    for machine in env.machine_names:
        assert len(env.applies(machine)) == 3, machine  # killed before the apply: applied once per pass
    assert overlapping_restarts(env.talos.history.events) == []
    assert at("Done")(driver.snapshots[-1]) or driver.snapshots[-1]["status"]["phase"] == "Completed"
