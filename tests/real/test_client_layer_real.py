"""The client-layer cases of tests/integration/test_kube_client_layer.py (status helper, typed errors,
Leases, uncached Secret reads, informer and elector) on the real kube-apiserver: the K3s tier's
cases, run wherever the tools are built rather than only where a Docker engine exists."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from ichord.kube import errors
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import machines, operations
from tests.integration import test_kube_client_layer as layer
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]

test_status_helper_retries_a_conflict_on_a_fresh_read = layer.test_status_helper_retries_a_conflict_on_a_fresh_read
test_typed_errors_from_a_real_api = layer.test_typed_errors_from_a_real_api
test_leases_and_uncached_secret_reads = layer.test_leases_and_uncached_secret_reads
test_informer_and_elector = layer.test_informer_and_elector
test_status_helper_with_a_cached_copy_skips_the_read_and_survives_a_stale_one = (
    layer.test_status_helper_with_a_cached_copy_skips_the_read_and_survives_a_stale_one)
test_a_status_write_sends_only_what_changed_and_the_object_ends_as_the_mutation_made_it = (
    layer.test_a_status_write_sends_only_what_changed_and_the_object_ends_as_the_mutation_made_it)


@pytest.fixture
async def kube(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[KubeClient]:
    """The admin client, with the machines these cases create gone first (the server is per session)."""
    client = await from_kubeconfig(control_plane.admin_kubeconfig)
    for name in ("m", "w", "c"):
        with contextlib.suppress(errors.NotFound):
            await machines(client).delete(layer.NS, name)
    with contextlib.suppress(errors.NotFound):
        await operations(client).delete(layer.NS, "diff")
    yield client
    await client.close()
