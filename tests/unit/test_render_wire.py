"""MachineConfig.wire_bytes (libyaml's emitter, render/wire.py), which every apply sends and a simulated node
serves, must hold exactly the values of the configuration for every reader: ruamel (YAML 1.2), fastload and
PyYAML (YAML 1.1); it keeps literal blocks. tests/real/test_render_oracle.py has Talos itself load and validate
every stage overlay in this form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ichord.pki.bundle import generate_bundle
from ichord.render import wire
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from tests.unit._renders import every_render_and_stage
from tests.unit.test_render_fastload import SCALARS

#: Strings some YAML reader would take for another type when written plain, and strings that need quoting.
TRICKY = ["0o17", "017", "0x1F", "1e3", "1E3", ".inf", "-.INF", ".NaN", "1_000", "+12", "-0.5", "1:20", "12.",
          ".5", "0b101", "-0x10", "yes", "No", "on", "OFF", "y", "n", "True", "FALSE", "null", "NULL", "~", "",
          "2024-01-01", "2001-12-14t21:59:43.10-05:00", "=", "<<", "-", "- a", "? q", ": x", "x: y", "#c", "# c",
          "a #b", "*a", "&b", "!t", "%x", "@x", "`x", "{a}", "[a]", '"q"', "'q'", " lead", "trail ", "tab\tin",
          "line1\nline2", "multi\nline\n", "ünïcødé", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"]


def _readers(data: bytes) -> list[Any]:
    return [MachineConfig.parse(data).plain(), MachineConfig.plain_of(data),
            [d for d in yaml.safe_load_all(data) if d is not None]]


def test_tricky_strings_stay_strings_for_every_reader() -> None:
    docs: list[Any] = [{"s": TRICKY, "keys": {t: t for t in TRICKY if t},
                        "n": [0, -1, 15, 1.5, 1e20, -0.25, True, False, None, {}, []]},
                       {"kind": "Second"}]
    data = wire.encode(docs)
    for read in _readers(data):
        assert read == docs


def test_edge_scalars_as_ruamel_read_them_survive() -> None:
    cfg = MachineConfig.parse(SCALARS)  # ruamel's own scalar types (an octal, a boolean) among them
    for read in _readers(cfg.wire_bytes()):
        assert read == cfg.plain()


def test_what_it_cannot_write_falls_back_to_ruamel() -> None:
    with pytest.raises(wire.WireEncodeError):
        wire.encode([{"a": object()}])


def test_every_render_and_stage_holds_the_same_values() -> None:
    for cfg in every_render_and_stage():
        data = cfg.wire_bytes()
        assert data != cfg.to_bytes()  # it is libyaml's layout, not a fallback to ruamel's
        for read in _readers(data):
            assert read == cfg.plain()
        assert MachineConfig.parse(data).hash() == cfg.hash()


def test_a_changed_configuration_encodes_differently() -> None:
    cfg = MachineConfig.parse("version: v1alpha1\nmachine:\n    type: worker\n")
    other = cfg.copy()
    other.documents[0]["machine"]["type"] = "controlplane"
    assert cfg.wire_bytes() != other.wire_bytes()
    assert MachineConfig.plain_of(other.wire_bytes())[0]["machine"]["type"] == "controlplane"


def test_a_reader_keeping_styles_re_encodes_the_original_text() -> None:
    """ruamel's round trip keeps literal blocks: what a client reads back and re-encodes is the original YAML
    (the simulated dry run diffs the encodings, so an unchanged configuration must show no changes)."""
    bundle = generate_bundle()
    cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1"})
    for role in ("controlplane", "worker"):
        cfg = render(bundle, cluster, MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role}))
        assert MachineConfig.parse(cfg.wire_bytes()).to_yaml() == cfg.to_yaml()


def test_talos_own_files_hold_the_same_values(talos_samples: Path) -> None:
    files = sorted(talos_samples.rglob("*.yaml"))
    assert files
    for path in files:
        try:
            cfg = MachineConfig.parse(path.read_bytes())
        except ConfigParseError:
            continue
        assert MachineConfig.parse(cfg.wire_bytes()).plain() == cfg.plain(), path.name
