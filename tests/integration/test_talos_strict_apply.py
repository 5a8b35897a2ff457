"""The simulated node decodes an applied configuration as machined does (sim/talos/decoder.py): a wrong type or an
unknown field in any document fails ApplyConfiguration with InvalidArgument, dry run or not, and changes nothing;
so a client path that forgets ichord's own validation fails on the wire. Both contracts, real mutual TLS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.render.config import MachineConfig
from ichord.sim.talos.cluster import SimCluster
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosInvalidArgumentError
from ichord.talos.proto.gen.machine import machine_pb2 as m
from tests.integration._talos_helpers import TalosLayout

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
NO_REBOOT = m.ApplyConfigurationRequest.NO_REBOOT


@pytest.fixture(params=[V1_13, V1_14], ids=str)
def talos_layout(request: pytest.FixtureRequest) -> TalosLayout:
    contract: VersionContract = request.param
    return TalosLayout(control_planes=1, workers=0, first=61, contract=contract)


def _wrong_type(cfg: MachineConfig) -> None:
    cfg.v1alpha1["machine"]["env"] = "just-a-string"


def _unknown_field(cfg: MachineConfig) -> None:
    cfg.v1alpha1["machine"]["nonsense"] = 1


def _unknown_kind(cfg: MachineConfig) -> None:
    cfg.documents.append({"apiVersion": "v1alpha1", "kind": "NoSuchConfig", "name": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("spoil", "says"), [
    (_wrong_type, "machine.env: expected a mapping"),
    (_unknown_field, "machine.nonsense: unknown field"),
    (_unknown_kind, "knows no document kind 'NoSuchConfig'"),
])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "apply"])
async def test_what_talos_cannot_decode_is_refused_with_invalid_argument(
        cluster: SimCluster, client: TalosClient, spoil: Callable[[MachineConfig], Any], says: str,
        dry_run: bool) -> None:
    cp = cluster.nodes["cp-1"]
    before = cp.running.hash()
    spoiled = cp.running.copy()
    spoil(spoiled)
    with pytest.raises(TalosInvalidArgumentError) as err:
        await client.apply_configuration(cp.endpoint, spoiled.wire_bytes(), NO_REBOOT,
                                         contract=cp.contract, dry_run=dry_run)
    assert err.value.code == "INVALID_ARGUMENT"
    assert "failed to parse config" in err.value.detail and says in err.value.detail, err.value.detail
    assert not cluster.history.of("apply", "cp-1")
    assert cp.running.hash() == before and cp.persistent.hash() == before
