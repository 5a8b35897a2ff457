"""A machine configuration's YAML as sent to (and, in the simulator, served by) a node, written by libyaml.

ruamel's emitter costs 8-25 ms per configuration: a wide pass writes one per machine while the daemon's event
loop waits, and a simulated fleet spent over a minute of CPU serving them. These bytes differ in layout from
``MachineConfig.to_yaml`` (which stays the human-facing text) but hold the same values for every reader: a
string is written plain only when both YAML 1.1's resolvers (PyYAML, libyaml) and YAML 1.2's (ruamel; Talos's
go-yaml v3 reads no wider) read it back as a string; otherwise it is quoted. Multi-line strings are literal
blocks, as ichord and Talos write them, so a reader that keeps styles re-encodes the original text. Anything
it cannot represent raises ``WireEncodeError``; ``MachineConfig.wire_bytes`` then uses ruamel.
"""

from __future__ import annotations

from typing import Any

import yaml
from ruamel.yaml.resolver import implicit_resolvers
from ruamel.yaml.scalarbool import ScalarBoolean

_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter when PyYAML was built with it


class WireEncodeError(Exception):
    """The documents hold a value the fast encoder does not write (the caller falls back to ruamel)."""


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


def _str(dumper: Any, data: str) -> Any:
    text = str(data)
    if "\n" in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_str(text)


_Dumper.add_multi_representer(int, _int)
_Dumper.add_multi_representer(float, lambda d, data: d.represent_float(float(data)))
_Dumper.add_representer(str, _str)
_Dumper.add_multi_representer(str, _str)


def encode(documents: list[Any]) -> bytes:
    """Plain documents (``MachineConfig.plain()``) as multi-document YAML that reads back as them under 1.1 and 1.2."""
    try:
        parts = [yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30, indent=4)
                 for doc in documents]
    except yaml.YAMLError as exc:  # RepresenterError: a type it does not know
        raise WireEncodeError(str(exc)) from None
    return "---\n".join(parts).encode()
