"""Reboot edges the roll depends on: the injected Reboot failure (``Faults.reboot_error``: Internal, the node
stays up on the same boot, the refusal in the history) and the graceful shutdown before a reboot
(``Timings.reboot_shutdown``: apid still answers, old boot ID, stage REBOOTING)."""

from __future__ import annotations

import pytest

from ichord.contract import V1_14
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.testing import eventually
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosRPCError
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def talos_layout() -> TalosLayout:
    return TalosLayout(control_planes=1, workers=1, first=81, timings={"reboot_shutdown": 0.3})


async def test_a_refused_reboot_leaves_the_node_up_on_its_boot(cluster: SimCluster, client: TalosClient) -> None:
    node = cluster.nodes["worker-1"]
    before = await client.boot_id(node.endpoint, V1_14)
    node.faults.reboot_error = "failed to acquire lock: sequence is already running"
    with pytest.raises(TalosRPCError) as err:
        await client.reboot(node.endpoint)
    assert (err.value.code, err.value.detail) == ("INTERNAL", "failed to acquire lock: sequence is already running")
    assert node.up and await client.boot_id(node.endpoint, V1_14) == before
    assert cluster.history.of("reboot_requested", "worker-1") == []
    assert [e["boot_id"] for e in cluster.history.of("reboot_refused", "worker-1")] == [before]

    node.faults.reboot_error = None
    await client.reboot(node.endpoint)
    await eventually(lambda: node.up and node.boot_id != before)
    assert len(cluster.history.of("reboot", "worker-1")) == 1


async def test_a_rebooting_node_answers_on_its_old_boot_in_stage_rebooting_until_it_goes_down(
        cluster: SimCluster, client: TalosClient) -> None:
    node = cluster.nodes["cp-1"]
    before = await client.boot_id(node.endpoint, V1_14)
    await client.reboot(node.endpoint)
    await eventually(lambda: node.stage == "MACHINE_STAGE_REBOOTING")
    assert (await client.machine_status(node.endpoint)).stage == "MACHINE_STAGE_REBOOTING"
    assert await client.boot_id(node.endpoint, V1_14) == before
    await eventually(lambda: not node.up)
    await eventually(lambda: node.up and node.stage == "MACHINE_STAGE_RUNNING")
    assert await client.boot_id(node.endpoint, V1_14) != before
