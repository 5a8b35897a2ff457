"""`ichord cluster status` against the simulators over the real wire, with a CA rotation in AwaitingCredentials.

The rotation is driven in-process by the Driver with its acknowledgement switched off, so it stays in
AwaitingCredentials; the command runs as a subprocess with the environment's kubeconfig, as an operator's.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import anyio
import pytest

from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment
from tests.integration._ca_rotation_driver import Driver, at, driving

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
CLI = "import sys; from ichord import cli; sys.exit(cli.main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.02, control_planes=3, workers=1) as e:
        yield e


@pytest.fixture
async def driver(env: SimEnvironment) -> AsyncIterator[Driver]:
    async with driving(env, acknowledge=False) as d:
        yield d


async def status(env: SimEnvironment, name: str) -> tuple[int, str, str]:
    proc = await anyio.run_process([sys.executable, "-c", CLI, "cluster", "status", name, "-n", env.namespace,
                                    "--kubeconfig", str(env.kubeconfig)], check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_status_of_a_rotation_awaiting_credentials_names_the_next_command(
        env: SimEnvironment, driver: Driver) -> None:
    await driver.create()
    await driver.run(until=at("AwaitingCredentials"))
    rc, out, err = await status(env, env.cluster_name)
    assert rc == 0, err
    assert f"TalosCluster {env.namespace}/{env.cluster_name}" in out
    assert f"{driver.op_name}  ca-rotation  phase InProgress  stage AwaitingCredentials" in out
    assert "waiting for: AwaitingCredentials:" in out
    # The command as it works pasted: with the kubeconfig the status was read with.
    assert (f"next: ichord cluster credentials {env.cluster_name} -n {env.namespace} --kubeconfig {env.kubeconfig} "
            "--acknowledge") in out
    for machine in ("cp-1", "cp-2", "cp-3", "worker-1"):
        assert f"{env.cluster_name}-{machine}" in out
    op = await driver.get()
    for cert in op["status"]["caRotation"]["certificates"]:
        assert cert["next"][:12] in out  # the new CAs' fingerprints, shortened
    assert "BEGIN" not in out and "PRIVATE KEY" not in out and "LS0tLS1CRUdJTi" not in out


async def test_a_missing_cluster_is_one_line_and_exit_2(env: SimEnvironment) -> None:
    rc, out, err = await status(env, "no-such-cluster")
    assert rc == 2 and out == ""
    assert err == f"ichord: TalosCluster {env.namespace}/no-such-cluster not found; check the name and -n\n"
