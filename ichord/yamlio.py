"""YAML encoding the way Talos (go-yaml v3) writes it: 4-space indentation, no line folding.

One place decides the dialect so that the bundle, rotation.yaml and rendered configurations are
all written alike and deterministically.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.scalarstring import LiteralScalarString

# Never fold long scalars (base64 PEM lines are long).
_WIDTH = 1 << 30


def round_trip() -> YAML:
    """A YAML instance that keeps comments, key order and quoting of what it loaded."""
    y = YAML(typ="rt")
    y.indent(mapping=4, sequence=4, offset=2)
    y.width = _WIDTH
    y.preserve_quotes = True
    return y


def _represent_none(rep: RoundTripRepresenter, _data: None) -> Any:
    return rep.represent_scalar("tag:yaml.org,2002:null", "null")


def dump(data: Any) -> str:
    """Dump one document in Talos's style (block style, 4-space indentation)."""
    y = round_trip()
    y.representer.add_representer(type(None), _represent_none)
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def literal(text: str) -> LiteralScalarString:
    """A block scalar (``|``), as Talos writes PEM text in the 1.14 documents."""
    out: LiteralScalarString = LiteralScalarString(text)
    return out


def load(text: str | bytes) -> Any:
    return round_trip().load(text)


def load_all(text: str | bytes) -> list[Any]:
    return [d for d in round_trip().load_all(text) if d is not None]
