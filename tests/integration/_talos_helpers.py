"""The shape of a simulated Talos cluster a test module starts: contract, node counts, addresses, timings."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ichord.contract import V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.sim.talos.build import node_specs
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.testing import fast_timings


@dataclasses.dataclass(frozen=True, kw_only=True)
class TalosLayout:
    """``cp-1..N`` then ``worker-1..M`` from ``127.0.0.<first>`` on; each module keeps its own addresses."""

    first: int
    contract: VersionContract = V1_14
    control_planes: int = 1
    workers: int = 1
    #: Overrides of fast_timings() (already scaled to milliseconds).
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    @asynccontextmanager
    async def running(self, bundle: SecretsBundle) -> AsyncIterator[SimCluster]:
        """The started cluster, closed on the way out."""
        cl = SimCluster(self.contract, fast_timings(**self.timings))
        await cl.start(node_specs(bundle, self.contract, self.control_planes, self.workers, first=self.first))
        try:
            yield cl
        finally:
            await cl.close()
