"""The reboot roll killed at every failpoint: a runner process (tests/chaos/_roll_runner.py) steps the roll
against a simulated 3+1 cluster with ``ICHORD_FAILPOINTS`` set, dies there (exit 137), and is started again
until the roll reports done. The Talos simulator's history then shows every control plane rebooted exactly
once (the worker never), one at a time, and the Nodes show none left cordoned.

Each failpoint is killed at its first hit (the first control plane) and at its second (the middle one);
``roll.ask_again.*`` are reached through a kill after the marker was written (same boot ID past
reboot_retry), ``roll.reboot_failed.*`` with a Reboot the middle node refuses once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from ichord.failpoints import EXIT_CODE
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.nodes import read_node_view
from ichord.operations.roll_store import StatusMarkerStore
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._roll_helpers import control_plane_plan, create_operation

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
SIM_SCALE = 0.02  # a simulated reboot takes 40 ms
#: The runner's Timing: retry 0.3 s, reboot_retry 3 s, node_action_timeout 12 s, poll 0.1 s.
RUNNER_TIME_SCALE = "0.01"
RUN_TIMEOUT = 60.0
MAX_RUNS = 6

#: The failpoints every node passes on the way through the roll, in order (roll.py's docstring).
PATH = ["roll.cordon.before", "roll.cordon.after", "roll.marker.before", "roll.marker.after", "roll.reboot.before",
        "roll.reboot.after", "roll.verified.before", "roll.verified.after", "roll.uncordon.before",
        "roll.uncordon.after", "roll.done.before", "roll.done.after"]
REFUSAL = "failed to acquire lock: sequence is already running"


@dataclass(frozen=True)
class Scenario:
    """``kills``: the ICHORD_FAILPOINTS of each run that must die, in turn; then runs without any until done."""

    kills: tuple[str, ...]
    #: Machine whose Reboot is refused until the first kill.
    refuse_reboot: str | None = None

    @property
    def id(self) -> str:
        return "+".join(self.kills)


SCENARIOS = [
    *(Scenario((fp,)) for fp in PATH),
    *(Scenario((f"{fp}:2",)) for fp in PATH),
    Scenario(("roll.marker.after", "roll.ask_again.before")),
    Scenario(("roll.marker.after:2", "roll.ask_again.after")),
    Scenario(("roll.reboot_failed.before",), refuse_reboot="demo-cp-2"),
    Scenario(("roll.reboot_failed.after",), refuse_reboot="demo-cp-2"),
]
ALL_FAILPOINTS = {*PATH, "roll.ask_again.before", "roll.ask_again.after", "roll.reboot_failed.before",
                  "roll.reboot_failed.after"}


def test_every_failpoint_of_roll_py_is_killed_by_a_scenario() -> None:
    source = (REPO / "ichord" / "operations" / "roll.py").read_text()
    named = {line.split('"')[1] for line in source.splitlines() if 'failpoint("' in line}
    killed = {k.split(":")[0] for s in SCENARIOS for k in s.kills}
    assert named == ALL_FAILPOINTS == killed


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=SIM_SCALE, control_planes=3, workers=1) as e:
        yield e


@pytest.fixture(scope="module")
async def kc(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    c = await from_kubeconfig(env.kubeconfig, timing=Timing())
    yield c
    await c.close()


@dataclass
class Runner:
    env: SimEnvironment
    operation: str
    plan: str
    workdir: Path
    runs: int = 0

    async def run(self, failpoints: str) -> tuple[int, str]:
        self.runs += 1
        environ = {**os.environ, "ICHORD_TIME_SCALE": RUNNER_TIME_SCALE, "ICHORD_FAILPOINTS": failpoints,
                   "PYTHONPATH": str(REPO)}
        environ.pop("KUBECONFIG", None)
        cmd = [sys.executable, "-m", "tests.chaos._roll_runner", "--kubeconfig", str(self.env.kubeconfig),
               "--namespace", self.env.namespace, "--operation", self.operation, "--secret", self.env.secret_name,
               "--plan", self.plan]
        with anyio.fail_after(RUN_TIMEOUT):
            done = await anyio.run_process(cmd, check=False, env=environ, cwd=str(REPO))
        out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        (self.workdir / f"run-{self.runs}.log").write_text(out)
        return done.returncode, out


async def roll_to_done(runner: Runner, scenario: Scenario, on_first_kill: Callable[[], None]) -> list[int]:
    codes = []
    for i, spec in enumerate(scenario.kills):
        code, out = await runner.run(spec)
        codes.append(code)
        assert code == EXIT_CODE and f"failpoint {spec.split(':')[0]} reached" in out, (
            f"run {runner.runs} with ICHORD_FAILPOINTS={spec} did not die there (exit {code}):\n{out[-3000:]}")
        if i == 0:
            on_first_kill()
    for _ in range(MAX_RUNS):
        code, out = await runner.run("")
        codes.append(code)
        if code == 0:
            return codes
        assert code == EXIT_CODE, f"run {runner.runs} without failpoints ended with {code}:\n{out[-3000:]}"
    raise AssertionError(f"the roll was not done after {MAX_RUNS} runs without failpoints")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
async def test_killed_at_a_failpoint_the_roll_reboots_each_node_once_and_leaves_none_cordoned(
        env: SimEnvironment, kc: KubeClient, scenario: Scenario, tmp_path: Path) -> None:
    name = "roll-" + scenario.id.replace(".", "-").replace(":", "-").replace("+", "-").replace("_", "-")
    store: StatusMarkerStore = await create_operation(kc, env.namespace, env.cluster_name, name)
    nodenames = {m: env.node(m).nodename for m in env.machine_names}
    plan = control_plane_plan(env.machines, env.endpoints, nodenames)
    cps = [t.machine for t in plan]
    start = len(env.talos.history.events)
    if scenario.refuse_reboot:
        env.node(scenario.refuse_reboot).faults.reboot_error = REFUSAL

    def clear_faults() -> None:
        if scenario.refuse_reboot:
            env.node(scenario.refuse_reboot).faults.reboot_error = None

    runner = Runner(env, name, json.dumps([t.__dict__ for t in plan]), tmp_path)
    try:
        codes = await roll_to_done(runner, scenario, clear_faults)
    finally:
        clear_faults()

    assert codes[:len(scenario.kills)] == [EXIT_CODE] * len(scenario.kills) and codes[-1] == 0
    history = env.talos.history.since(start)
    reboots = {m: sum(1 for e in history if e["kind"] == "reboot" and e["node"] == env.node(m).name)
               for m in env.machine_names}
    assert reboots == {m: int(m in cps) for m in env.machine_names}, f"reboots per machine: {reboots}"
    # One at a time, in order: a control plane is asked only once the one before it came back.
    order = [(e["kind"], e["node"]) for e in history if e["kind"] == "reboot"
             or (e["kind"] == "reboot_requested" and e["happens"])]
    assert order == [(k, env.node(m).name) for m in cps for k in ("reboot_requested", "reboot")]
    for m in env.machine_names:
        node = await read_node_view(kc, nodenames[m])
        assert not node.unschedulable and not node.cordoned_by_ichord, f"{m} left cordoned"
    marker = await store.read()
    assert (marker.rebooting, marker.done) == ("", tuple(cps))
    if scenario.refuse_reboot:
        assert [e["kind"] for e in history if e["kind"] == "reboot_refused"] == ["reboot_refused"]
