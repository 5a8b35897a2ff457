"""A machine configuration's YAML as sent to a node, written by libyaml (PyYAML's C emitter).

ruamel's emitter costs 10-25 ms per configuration; a wide pass writes one per machine and the daemon's
event loop waits for each. The bytes differ in layout from ``MachineConfig.to_yaml`` (which stays the
human-facing text) but hold the same values for every reader: every string that YAML 1.1 (PyYAML),
YAML 1.2 (ruamel, fastload) or Go's yaml.v3 (Talos) could read as anything but a string is quoted.
libyaml's own check covers YAML 1.1; the rest ("0o17", "1e3", "1_000") all start like a number, so any
string that does is quoted too (a quoted string is a string to every reader). Anything it cannot
represent raises ``WireEncodeError``; the caller then uses ruamel.
"""

from __future__ import annotations

from typing import Any

import yaml

_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when PyYAML was built with it
_NUMBER_LIKE = frozenset("+-.0123456789")
#: Words YAML 1.2's core schema and yaml.v3 read as booleans or null (a subset of YAML 1.1's, quoted already);
#: listed so that the rule does not hang on libyaml's resolver alone.
_WORDS = frozenset({"true", "false", "null", "~", "yes", "no", "on", "off", "y", "n"})


class WireEncodeError(Exception):
    """The documents hold a value the fast encoder does not write (the caller falls back to ruamel)."""


class _Dumper(_BASE):  # type: ignore[misc]
    pass


def _str(dumper: Any, value: str) -> Any:
    quoted = bool(value) and (value[0] in _NUMBER_LIKE or value.lower() in _WORDS)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if quoted else None)


_Dumper.add_representer(str, _str)


def encode(documents: list[Any]) -> bytes:
    """Plain documents (dict/list/str/int/float/bool/None, as ``MachineConfig.plain()``) as multi-document YAML."""
    try:
        text = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                             allow_unicode=True, width=1 << 30)
    except yaml.YAMLError as exc:  # RepresenterError: a type it does not know
        raise WireEncodeError(str(exc)) from None
    return str(text).encode()
