"""A simulated node's configuration as bytes, fast: libyaml's emitter, quoting what YAML 1.1 or 1.2 would misread.

A node returns its configuration on every COSI Get of MachineConfig. ruamel's emitter (``MachineConfig.to_bytes``)
costs ~16 ms for a control plane's configuration; a fleet of 4,000 nodes spent over a minute of the simulator's
CPU on it while the daemon converged on the same cores. Talos itself returns its own encoding, not ichord's, so
the simulator need not mirror ruamel's layout, only the values: every string that either YAML 1.1 (PyYAML,
libyaml) or YAML 1.2 (ruamel, go-yaml v3, Talos) would resolve to something else is quoted, so any reader of
either version reads back exactly the documents' ``plain()`` (tests/unit/test_sim_encoding.py).
"""

from __future__ import annotations

from typing import Any

import yaml
from ruamel.yaml.resolver import implicit_resolvers
from ruamel.yaml.scalarbool import ScalarBoolean

from ichord.render.config import MachineConfig

_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter when PyYAML was built with it


class _Dumper(_BASE):  # type: ignore[misc]
    pass


# YAML 1.1's resolvers (inherited) plus YAML 1.2's: a plain scalar is emitted only when both read it as a string.
_Dumper.yaml_implicit_resolvers = {k: list(v) for k, v in _BASE.yaml_implicit_resolvers.items()}
for _versions, _tag, _regexp, _first in implicit_resolvers:
    if (1, 2) in _versions:
        _Dumper.add_implicit_resolver(_tag, _regexp, _first)


def _int(dumper: Any, data: int) -> Any:
    # ruamel's own scalar types (an octal, a boolean it read) are ints; their values are what plain() compares.
    if isinstance(data, ScalarBoolean):
        return dumper.represent_bool(bool(data))
    return dumper.represent_int(int(data))


_Dumper.add_multi_representer(int, _int)
_Dumper.add_multi_representer(float, lambda d, data: d.represent_float(float(data)))
def _str(dumper: Any, data: str) -> Any:
    # Multi-line strings (certificates, manifests) as literal blocks, as ichord and Talos write them: a reader
    # that keeps styles (ruamel's round trip) then re-encodes them as they were (the dry run's diff).
    text = str(data)
    if "\n" in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_str(text)


_Dumper.add_representer(str, _str)
_Dumper.add_multi_representer(str, _str)


def encode(config: MachineConfig) -> bytes:
    """The documents as multi-document YAML that reads back as ``config.plain()`` under YAML 1.1 and 1.2."""
    parts = [yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30, indent=4)
             for doc in config.plain()]
    return "---\n".join(parts).encode()
