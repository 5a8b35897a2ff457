"""MachineConfig.plain_of (libyaml with ruamel's YAML 1.2 resolution) must give ruamel's answer, always."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.render import fastload
from ichord.render.config import ConfigParseError, MachineConfig
from tests.unit._renders import every_render_and_stage

#: Scalars where YAML 1.1 (PyYAML's default) and 1.2 (ruamel, Talos's go-yaml v3) disagree, and friends.
SCALARS = """
a: yes
b: on
c: True
d: 0o17
e: 017
f: 0x1F
g: 1e3
h: .inf
i: ~
k: 1_000
l: +12
m: -0.5
n: 1:20
o: null
p: 12.
q: .5
r: NULL
s: "0o17"
t: 'true'
u: 0b101
v: -0x10
w: ''
x:
y: [1, "2", three, 4.0, false]
z: |
  multi
  line
"""


def test_edge_scalars_read_as_ruamel_reads_them() -> None:
    ref = MachineConfig.parse(SCALARS).plain()
    assert fastload.load_documents(SCALARS)  # the fast path itself took it (no fallback)
    assert MachineConfig.plain_of(SCALARS) == ref
    assert ref[0]["a"] == "yes" and ref[0]["d"] == 15 and ref[0]["e"] == 17 and ref[0]["n"] == "1:20"


@pytest.mark.parametrize("text", [
    "a: 2024-01-01\n",                 # a timestamp: ruamel constructs a date
    "base: &b {x: 1}\nm:\n  <<: *b\n",  # a merge key
    "a: !custom 1\n",                  # an explicit tag
    "a: 1\na: 2\n",                    # a duplicate key: ruamel refuses it
    "- 1\n- 2\n",                      # not a mapping
])
def test_what_it_does_not_mirror_falls_back_to_ruamel(text: str) -> None:
    with pytest.raises(fastload.Unsupported):
        fastload.load_documents(text)
    try:
        ref = MachineConfig.parse(text).plain()
    except ConfigParseError:
        with pytest.raises(ConfigParseError):
            MachineConfig.plain_of(text)
        return
    assert repr(MachineConfig.plain_of(text)) == repr(ref)  # a TaggedScalar has no equality of its own


def test_invalid_yaml_is_ruamels_error() -> None:
    with pytest.raises(ConfigParseError):
        MachineConfig.plain_of("a: [1, 2\n")


def test_every_render_and_stage_reads_the_same() -> None:
    for cfg in every_render_and_stage():
        data = cfg.to_bytes()
        fastload.load_documents(data)  # no fallback on what ichord renders
        assert MachineConfig.plain_of(data) == MachineConfig.parse(data).plain() == cfg.plain()


def test_talos_own_files_read_the_same(talos_samples: Path) -> None:
    files = sorted(talos_samples.rglob("*.yaml"))
    assert files
    for path in files:
        data = path.read_bytes()
        try:
            ref = MachineConfig.parse(data).plain()
        except ConfigParseError:
            continue
        assert MachineConfig.plain_of(data) == ref, path.name


def test_parse_values_reads_what_parse_reads() -> None:
    for text in (SCALARS, "a: 2024-01-01\n", "base: &b {x: 1}\nm:\n  <<: *b\n"):
        assert MachineConfig.parse_values(text).plain() == MachineConfig.parse(text).plain()
    with pytest.raises(ConfigParseError):
        MachineConfig.parse_values("a: [1, 2\n")
