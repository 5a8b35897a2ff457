"""The fleet (scripts/bench_idle.py): many simulated Talos clusters, one Kubernetes API for ichord's objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.api.names import SECRETS_KEY
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.reads import read_secret
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import export_fingerprint
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.sim.combined.fleet import Fleet
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


async def test_every_cluster_has_its_block_its_objects_and_nodes_running_what_renders(
        bundle: SecretsBundle, tmp_path: Path) -> None:
    async with Fleet(2, control_planes=1, workers=1, bundle=bundle, time_scale=0.02) as fleet, \
            TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as talos:
        assert [c.name for c in fleet.clusters] == ["c0001", "c0002"]
        assert len({c.prefix for c in fleet.clusters}) == 2, "each cluster needs its own 127.A.B.0/24 block"
        assert fleet.machine_count == 4
        assert fleet.ready_reasons() == {"": 4}  # nothing reconciled them yet

        for cluster in fleet.clusters:
            # The nodes answer over real mutual TLS with exactly what the cluster's objects render to.
            inputs = ClusterInputs.from_spec(cluster.name, cluster.cluster_spec)
            for plan in cluster.machines:
                assert plan.ip.startswith(cluster.prefix)
                running = MachineConfig.parse(await talos.machine_config(plan.address))
                expected = render(bundle, inputs, MachineInputs.from_spec(cluster.machine_specs[plan.name]))
                assert running.plain() == expected.plain()

        # Every object lives on the one shared API server, reachable with the fleet's kubeconfig.
        kube = await from_kubeconfig(fleet.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            machines, _ = await crds.machines(kube).list_objects(fleet.namespace)
            clusters, _ = await crds.clusters(kube).list_objects(fleet.namespace)
            secret = await read_secret(kube, fleet.namespace, "c0002-secrets")
        finally:
            await kube.close()
        assert sorted(m["metadata"]["name"] for m in machines) == [
            "c0001-cp-1", "c0001-worker-1", "c0002-cp-1", "c0002-worker-1"]
        assert sorted(c["metadata"]["name"] for c in clusters) == ["c0001", "c0002"]
        shared = SecretsBundle.from_yaml(secret.data[SECRETS_KEY], "fleet secret")
        assert export_fingerprint(shared) == export_fingerprint(bundle)  # one bundle for every cluster
