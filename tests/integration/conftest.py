"""Fixtures shared by the integration tests: a simulated Talos cluster with an admin client, and the
Kubernetes API simulator with a client. A module shapes them by overriding ``talos_layout``,
``sim_settings`` or ``kube_timing``; a module's own fixture of the same name still wins."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.sim.talos.cluster import SimCluster
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from tests.integration._ca_rotation_driver import Driver, driving
from tests.integration._talos_helpers import TalosLayout

# --- Talos -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    """One secrets bundle per module: generating keys is the slow part."""
    return generate_bundle()


@pytest.fixture
def talos_layout() -> TalosLayout:
    """Overridden by every module that uses ``cluster``: its node counts, addresses and timings."""
    pytest.fail("a module using the `cluster` fixture must define a `talos_layout` fixture", pytrace=False)


@pytest.fixture
async def cluster(bundle: SecretsBundle, talos_layout: TalosLayout) -> AsyncIterator[SimCluster]:
    async with talos_layout.running(bundle) as cl:
        yield cl


@pytest.fixture
async def client(bundle: SecretsBundle) -> AsyncIterator[TalosClient]:
    """A Talos client with the bundle's os:admin credentials."""
    async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as c:
        yield c


# --- Kubernetes --------------------------------------------------------------------------------------


@pytest.fixture
def sim_settings() -> SimSettings | None:
    """The Kubernetes simulator's settings (None: its defaults)."""
    return None


@pytest.fixture
def kube_timing() -> Timing | None:
    """The client's timing (None: Timing.from_env(), as from_kubeconfig does)."""
    return None


@pytest.fixture
async def sim(sim_settings: SimSettings | None) -> AsyncIterator[KubeSimulator]:
    async with KubeSimulator(sim_settings) as s:
        yield s


@pytest.fixture
async def kube(sim: KubeSimulator, tmp_path: Path, kube_timing: Timing | None) -> AsyncIterator[KubeClient]:
    c = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kubeconfig"), timing=kube_timing)
    yield c
    await c.close()


# --- the ca-rotation driver's world --------------------------------------------------------------------

#: The simulators' time scale of ``env`` (a module that needs another defines its own ``env``).
ENV_SCALE = 0.02


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    """A self-hosted 3+1 SimEnvironment; modules that add client workloads override it."""
    async with SimEnvironment(bundle=bundle, time_scale=ENV_SCALE) as e:
        yield e


@pytest.fixture
async def driver(env: SimEnvironment) -> AsyncIterator[Driver]:
    """Steps the ca-rotation's ``advance`` on ``env`` as the cluster actor would (_ca_rotation_driver)."""
    async with driving(env) as d:
        yield d
