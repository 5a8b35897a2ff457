"""Machine configurations as plain data, fast: libyaml with ruamel's YAML 1.2 resolution, for comparisons.

Comparing what a node runs with what ichord renders happens on every machine step and several
times per machine in every CA-rotation pass. ruamel's round-trip loader (which ``MachineConfig``
needs to edit and re-encode documents) costs ~35 ms for an 11 KB configuration; libyaml costs ~2 ms.
The two must agree on every value, so this loader takes its implicit resolvers from ruamel's own
YAML 1.2 table (``yes``/``on`` stay strings, ``0o17`` is octal, ``017`` is 17) and constructs
only what that yields for plain scalars. Anything else (timestamps, merge keys, explicit tags,
duplicate keys, a non-mapping document) raises ``Unsupported`` and the caller falls back to
ruamel, so the answer is always ruamel's; only the time differs.
"""

from __future__ import annotations

from typing import Any

import yaml
from ruamel.yaml.resolver import implicit_resolvers

_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it
_PLAIN_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}


class Unsupported(Exception):
    """The document uses something this loader does not mirror exactly; use ruamel for it."""


class _Loader(_BASE):  # type: ignore[misc]
    pass


_Loader.yaml_implicit_resolvers = {}
for _versions, _tag, _regexp, _first in implicit_resolvers:
    if (1, 2) in _versions:
        _Loader.add_implicit_resolver(_tag, _regexp, _first)


def _int(loader: Any, node: Any) -> int:
    """YAML 1.2 as ruamel reads it: 0b/0o/0x prefixes, underscores, and a leading 0 is still decimal."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    for prefix, base in (("0b", 2), ("0o", 8), ("0x", 16)):
        if digits.startswith(prefix):
            return sign * int(digits[2:], base)
    return sign * int(digits)


def _unsupported(loader: Any, node: Any) -> Any:
    raise Unsupported(f"{node.tag} at line {node.start_mark.line + 1}")


def _mapping(loader: Any, node: Any) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        if key_node.tag not in _PLAIN_TAGS or key_node.tag.endswith((":map", ":seq")):
            raise Unsupported(f"key {key_node.tag} at line {key_node.start_mark.line + 1}")  # incl. merge keys
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise Unsupported(f"duplicate key at line {key_node.start_mark.line + 1}")  # ruamel refuses it
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)
for _tag in ("timestamp", "merge", "value", "yaml", "binary", "omap", "pairs", "set"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _unsupported)
_Loader.add_constructor(None, _unsupported)  # any explicit tag of its own


def load_documents(data: str | bytes) -> list[dict[Any, Any]]:
    """The non-empty documents of ``data`` as dicts/lists/scalars; Unsupported when ruamel must decide."""
    try:
        docs = [d for d in yaml.load_all(data, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise Unsupported("not valid YAML for libyaml") from exc
    for d in docs:
        if not isinstance(d, dict):
            raise Unsupported("a document that is not a mapping")
    return docs
