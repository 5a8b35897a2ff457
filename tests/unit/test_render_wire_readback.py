"""MachineConfig.wire_bytes (render/wire.py), which a pass applies and a simulated node serves, reads back as the
configuration's plain() under YAML 1.1 and 1.2, and keeps literal blocks."""

from __future__ import annotations

import yaml

from ichord.api.carotation import Stage
from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import generate_bundle
from ichord.pki.rotation import TARGET_ORDER, Target, generate_rotation
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage
from tests.unit.test_render_fastload import SCALARS


def encode(cfg: MachineConfig) -> bytes:
    return cfg.wire_bytes()


#: Strings each YAML version reads as something else when unquoted; they must come back as strings.
AMBIGUOUS = ["yes", "on", "off", "y", "n", "True", "NULL", "~", "0o17", "017", "0x1F", "1e3", ".inf", ".NaN",
             "1_000", "+12", "1:20", "12.", ".5", "0b101", "2024-01-01", "", " lead", "trail ", "a: b", "# c",
             "- x", "multi\nline\n", "tab\there", "ünï", "*alias", "&anchor", "!tag", "%x", "@x", "`x", "'q'", '"q"']


def _reads_back(cfg: MachineConfig) -> None:
    data = encode(cfg)
    plain = cfg.plain()
    assert MachineConfig.plain_of(data) == plain  # ichord's fast reader (YAML 1.2)
    assert MachineConfig.parse(data).plain() == plain  # ruamel (YAML 1.2)
    assert [d for d in yaml.safe_load_all(data) if d is not None] == plain  # PyYAML (YAML 1.1)


def test_edge_scalars_survive() -> None:
    _reads_back(MachineConfig.parse(SCALARS))
    doc = MachineConfig.parse("version: v1alpha1\n")
    doc.documents[0]["strings"] = list(AMBIGUOUS)
    doc.documents[0]["keys"] = {s: s for s in AMBIGUOUS if s}
    doc.documents[0]["numbers"] = [0, -1, 15, 1.5, 1e20, -0.25, True, False, None]
    _reads_back(doc)
    assert MachineConfig.plain_of(encode(doc))[0]["strings"] == AMBIGUOUS


def test_every_render_and_stage_survives() -> None:
    bundle = generate_bundle()
    for contract in (V1_13, V1_14):
        rotation = generate_rotation([t for t in TARGET_ORDER
                                      if contract is V1_14 or t is not Target.KUBERNETES_AGGREGATOR])
        cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1",
                                                   "talosVersion": str(contract)})
        for role in ("controlplane", "worker"):
            machine = MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role})
            _reads_back(render(bundle, cluster, machine))
            for stage in (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING):
                _reads_back(render_stage(bundle, rotation, stage, cluster, machine))


def test_a_changed_configuration_encodes_differently() -> None:
    cfg = MachineConfig.parse("version: v1alpha1\nmachine:\n    type: worker\n")
    other = cfg.copy()
    other.documents[0]["machine"]["type"] = "controlplane"
    assert encode(cfg) != encode(other)
    assert MachineConfig.plain_of(encode(other))[0]["machine"]["type"] == "controlplane"


def test_a_reader_keeping_styles_re_encodes_the_original_text() -> None:
    """ruamel's round trip keeps literal blocks: what a client reads back and re-encodes is the original YAML
    (the simulated dry run diffs the encodings, so an unchanged configuration must show no changes)."""
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1"})
    for role in ("controlplane", "worker"):
        cfg = render(bundle, cluster, MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role}))
        assert MachineConfig.parse(encode(cfg)).to_yaml() == cfg.to_yaml()
