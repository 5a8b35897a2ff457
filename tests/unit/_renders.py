"""Every configuration ichord renders, for the YAML reader/writer equivalence tests: both contracts, both roles,
the plain render and each pass stage's overlay (every target the contract supports)."""

from __future__ import annotations

import functools

from ichord.api.carotation import Stage
from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import generate_bundle
from ichord.pki.rotation import TARGET_ORDER, Target, generate_rotation
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage


@functools.cache
def every_render_and_stage() -> tuple[MachineConfig, ...]:
    bundle = generate_bundle()
    out: list[MachineConfig] = []
    for contract in (V1_13, V1_14):
        # v1.13 has no accepted list for the aggregator CA: rotate the others there
        rotation = generate_rotation([t for t in TARGET_ORDER
                                      if contract is V1_14 or t is not Target.KUBERNETES_AGGREGATOR])
        cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1",
                                                   "talosVersion": str(contract)})
        for role in ("controlplane", "worker"):
            machine = MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role})
            out.append(render(bundle, cluster, machine))
            out += [render_stage(bundle, rotation, s, cluster, machine)
                    for s in (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING)]
    return tuple(out)
