"""``ManagedClients`` on the simulators: one admin client per cluster across steps, issued again only when needed.

The admin kubeconfig comes from a control plane's Kubeconfig RPC (real mutual TLS) and the client talks HTTPS to
the simulated managed API. Counted here: how many kubeconfigs were asked for, by a TalosClient that counts them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ichord.api.views import MachineView
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.errors import KubeError
from ichord.kube.reads import list_nodes
from ichord.operations.managed.clients import ManagedAPIError, ManagedClients
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

KEY = "ns/cluster"


class CountingTalos(TalosClient):
    """The real client; it only counts the kubeconfigs it asked for."""

    issued = 0

    async def kubeconfig(self, endpoint: str) -> bytes:
        self.issued += 1
        return await super().kubeconfig(endpoint)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.02, control_planes=1, workers=1) as e:
        yield e


@pytest.fixture
async def talos(bundle: SecretsBundle) -> AsyncIterator[CountingTalos]:
    async with CountingTalos(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as c:
        yield c


async def _control_planes(env: SimEnvironment) -> list[MachineView]:
    async with await from_kubeconfig(env.kubeconfig) as kc:
        objs, _ = await crds.machines(kc).list_objects(env.namespace)
    return [m for m in (MachineView.of(o) for o in objs) if m.is_control_plane]


async def test_one_kubeconfig_serves_every_step_until_the_credentials_change_or_it_is_closed(
        env: SimEnvironment, talos: CountingTalos, bundle: SecretsBundle) -> None:
    cps = await _control_planes(env)
    clients = ManagedClients()
    trusted = [bundle.k8s.cert_pem]
    async with clients.client(KEY, talos, cps, trusted) as first:
        assert len(await list_nodes(first)) == 2
    for _ in range(3):
        async with clients.client(KEY, talos, cps, trusted) as again:
            assert again is first
            assert len(await list_nodes(again)) == 2
    assert talos.issued == 1

    # Another trust set (as in a rotation's Issuing): a new client, the old one closed.
    other = generate_ca(CAKind.KUBERNETES).cert_pem
    async with clients.client(KEY, talos, cps, [*trusted, other]) as renewed:
        assert renewed is not first and len(await list_nodes(renewed)) == 2
    assert talos.issued == 2 and first.api.rest_client.pool_manager.closed

    await clients.close(KEY)
    assert KEY not in clients and renewed.api.rest_client.pool_manager.closed


async def test_a_use_that_raises_or_leaves_the_api_unreachable_drops_the_client(
        env: SimEnvironment, talos: CountingTalos, bundle: SecretsBundle) -> None:
    cps = await _control_planes(env)
    clients = ManagedClients()
    trusted = [bundle.k8s.cert_pem]
    with pytest.raises(ManagedAPIError):
        async with clients.client(KEY, talos, cps, trusted) as first:
            raise ManagedAPIError("the step could not read what it needed")
    assert KEY not in clients and first.api.rest_client.pool_manager.closed

    async with env.kube.outage(), clients.client(KEY, talos, cps, trusted) as second:
        with pytest.raises(KubeError):
            await list_nodes(second)
    assert KEY not in clients and second.api.rest_client.pool_manager.closed

    async with clients.client(KEY, talos, cps, trusted) as third:
        assert len(await list_nodes(third)) == 2
    assert talos.issued == 3
    await clients.close_all()
    assert KEY not in clients
