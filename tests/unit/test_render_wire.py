"""MachineConfig.wire_bytes (libyaml's emitter, render/wire.py) must hold exactly the values of the render for
every reader: ruamel (YAML 1.2), fastload, and PyYAML's YAML 1.1; tests/real/test_render_oracle.py has Talos
itself load and validate every stage overlay in this form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ichord.api.carotation import Stage
from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import generate_bundle
from ichord.pki.rotation import TARGET_ORDER, Target, generate_rotation
from ichord.render import wire
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage

#: Strings some YAML reader would take for another type when written plain, and strings that need quoting.
TRICKY = ["0o17", "017", "0x1F", "1e3", "1E3", ".inf", "-.INF", ".NaN", "1_000", "+12", "-0.5", "1:20", "12.",
          ".5", "0b101", "-0x10", "yes", "No", "on", "OFF", "y", "n", "True", "FALSE", "null", "NULL", "~", "",
          "2024-01-01", "2001-12-14t21:59:43.10-05:00", "=", "<<", "-", "- a", "? q", ": x", "x: y", "#c", "a #b",
          "*a", "&b", "!t", "%x", "@x", "`x", "{a}", "[a]", '"q"', "'q'", " lead", "trail ", "tab\tin",
          "line1\nline2", "ünïcødé", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"]


def _readers(data: bytes) -> list[Any]:
    return [MachineConfig.parse(data).plain(), MachineConfig.plain_of(data), list(yaml.safe_load_all(data))]


def test_tricky_strings_stay_strings_for_every_reader() -> None:
    docs: list[Any] = [{"s": TRICKY, "keys": {t: t for t in TRICKY if t}, "n": [1, -2, 1.5, True, None, {}, []]},
                       {"kind": "Second"}]
    data = wire.encode(docs)
    for read in _readers(data):
        assert read == docs


def test_what_it_cannot_write_falls_back_to_ruamel() -> None:
    with pytest.raises(wire.WireEncodeError):
        wire.encode([{"a": object()}])


def _configs() -> list[MachineConfig]:
    bundle = generate_bundle()
    out: list[MachineConfig] = []
    for contract in (V1_13, V1_14):
        rotation = generate_rotation([t for t in TARGET_ORDER
                                      if contract is V1_14 or t is not Target.KUBERNETES_AGGREGATOR])
        cluster = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1",
                                                   "talosVersion": str(contract)})
        for role in ("controlplane", "worker"):
            machine = MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role})
            out.append(render(bundle, cluster, machine))
            out += [render_stage(bundle, rotation, s, cluster, machine)
                    for s in (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING)]
    return out


def test_every_render_and_stage_holds_the_same_values() -> None:
    for cfg in _configs():
        data = cfg.wire_bytes()
        assert data != cfg.to_bytes()  # it is libyaml's layout, not a fallback to ruamel's
        for read in _readers(data):
            assert read == cfg.plain()
        assert MachineConfig.parse(data).hash() == cfg.hash()


def test_talos_own_files_hold_the_same_values(talos_samples: Path) -> None:
    files = sorted(talos_samples.rglob("*.yaml"))
    assert files
    for path in files:
        try:
            cfg = MachineConfig.parse(path.read_bytes())
        except ConfigParseError:
            continue
        assert MachineConfig.parse(cfg.wire_bytes()).plain() == cfg.plain(), path.name
