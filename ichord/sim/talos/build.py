"""Configurations for a simulated cluster, rendered the way ``ichord render`` renders them."""

from __future__ import annotations

from ichord.contract import VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.sim.talos.cluster import NodeSpec

KUBERNETES_VERSION = "1.34.1"


def cluster_inputs(contract: VersionContract, endpoint_ip: str, name: str = "sim") -> ClusterInputs:
    return ClusterInputs(cluster_name=name, endpoint=f"https://{endpoint_ip}:6443",
                         kubernetes_version=KUBERNETES_VERSION, contract=contract)


def node_specs(bundle: SecretsBundle, contract: VersionContract, control_planes: int, workers: int, *,
               ip_prefix: str = "127.0.0.", first: int = 11, port: int = 0, name: str = "sim") -> list[NodeSpec]:
    """``cp-1..N`` then ``worker-1..M`` on consecutive loopback addresses, each running its render."""
    inputs = cluster_inputs(contract, f"{ip_prefix}{first}", name)
    specs = []
    roles = [("controlplane", f"cp-{i + 1}") for i in range(control_planes)]
    roles += [("worker", f"worker-{i + 1}") for i in range(workers)]
    for i, (role, host) in enumerate(roles):
        config = render(bundle, inputs, MachineInputs(role=role, hostname=host))  # type: ignore[arg-type]
        specs.append(NodeSpec(host, config, f"{ip_prefix}{first + i}", port))
    return specs
