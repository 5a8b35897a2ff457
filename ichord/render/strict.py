"""Talos's strict configuration decoder, checked before anything is applied: unknown fields and wrong types.

Talos decodes every document of a machine configuration (and of every strategic merge patch, before it
merges it) in two steps: go-yaml decodes the document into the Go struct of its kind, which refuses a value
of the wrong type (a string where a mapping is expected), then ``xyaml.CheckUnknownKeys`` refuses any key no
field of the struct carries. A configuration Talos would refuse must never reach a node: ichord renders it,
checks it here, and reports it (``InvalidConfig``) instead of classifying it.

Where the knowledge comes from: ``render/schema/v1.13.json`` and ``v1.14.json``, generated artifacts written
by ``tools/talos-oracle/gen_schema.py`` from the pinned machinery of each contract (the oracle's ``schema``
case): every registered document kind's Go type, walked as CheckUnknownKeys walks it, and for every type the
probe values (``PROBES``, encoded as ichord encodes values) that go-yaml and CheckUnknownKeys accept when
decoding into it, so go-yaml's scalar rules and each type's own unmarshaler are Talos's verdicts, not a
description of them. ``tests/real/test_talos_schema.py`` keeps the files current; the validator differential
(``tests/real/test_strict_oracle.py``) holds the verdicts to Talos's decoder.

The text a type with its own unmarshaler parses (a size, an address, a MAC, base64) is judged by that type's
grammar as ``_CONTENT`` writes it from machinery's parsers (go-humanize's ParseBytes, net/netip, net.ParseMAC,
encoding/base64), each a subset of what Talos accepts, so ichord never passes text Talos refuses; an
enumeration by the names the schema lists; any other such type by the probes it took. Talos's semantic
validation (its ``Validate``: a hostname's form, a disk that must exist) is the node's and the dry run's.

Two kinds of type with their own unmarshaler need more than their probes: a list type that decodes a list of
mappings into its Go element type (v1alpha1.ClusterInlineManifests: its verdict on ``seqemptymap`` says it takes
the shape, and its elements are checked as the element type), and crypto's PEM types, which read their fields
as base64 text whatever the Go field's type (``_FIELD_TEXT``). ``tests/real/test_strict_lists_oracle.py`` holds
every list-of-struct field to Talos's verdict both ways.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ichord.contract import VersionContract
from ichord.render import wire
from ichord.render.config import V1ALPHA1, MachineConfig
from ichord.render.errors import PatchError, RenderError

#: The probe values the schema records verdicts for: name -> the Python value ichord would write.
PROBES: dict[str, Any] = {
    "null": None,
    "bool": True,
    "zero": 0,
    "int": 1,
    "negint": -1,
    "float": 1.5,
    "floatint": 1.0,
    "emptymap": {},
    "map": {"zz_probe": "x"},
    "seq": ["x"],
    "seqmap": [{"zz_probe": "x"}],
    # A list of one empty mapping: whether a type takes a list of mappings at all. ``seqmap``'s key is unknown
    # to every struct, so a list of structs refuses it for the key, not the shape (render/strict.py's check).
    "seqemptymap": [{}],
    "seqseq": [["x"]],
    "emptyseq": [],
    "s_word": "x",
    "s_int": "1",
    "s_true": "true",
    "s_yes": "yes",
    "s_empty": "",
    "s_dur": "5m",
    "s_cidr": "10.0.0.0/8",
    "s_ip": "1.2.3.4",
    "s_url": "https://example.com:6443",
}
STRING_PROBES = frozenset(k for k, v in PROBES.items() if isinstance(v, str))

# Strings go-yaml reads in a way of their own: YAML 1.1's booleans (into a bool), Go durations, numbers.
_YES_NO = re.compile(r"^(y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$")
_TRUE_FALSE = re.compile(r"^(true|True|TRUE|false|False|FALSE)$")
_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$|^0$")
_INT = re.compile(r"^[-+]?\d+$")
_CIDR = re.compile(r"^[0-9a-fA-F:.]+/\d+$")
_IP = re.compile(r"^(\d+\.\d+\.\d+\.\d+|[0-9a-fA-F:]*:[0-9a-fA-F:.]*)$")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


# ---- the text of types with their own parsers (each a subset of what the Go parser accepts) ----------------

# Whole-text matches (fullmatch), ASCII digits only (Go's parsers take no other).
_SIZE = re.compile(r"[0-9]+(\.[0-9]+)? ?(b|kib|kb|mib|mb|gib|gb|tib|tb|pib|pb|eib|eb|ki|k|mi|m|gi|g|ti|t|pi|p|ei|e)?",
                   re.IGNORECASE)
_MATCHER = re.compile(r" *(>=|<=|>|<|==)? *(.+?) *")
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}|[0-9a-fA-F]{2}(-[0-9a-fA-F]{2}){5}")
_PREFIX = re.compile(r"([0-9a-fA-F:.]+)/(0|[1-9][0-9]{0,2})")
_ADDR_PORT = re.compile(r"([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+|\[[0-9a-fA-F:.]+\]):(0|[1-9][0-9]{0,4})")
_ADDR = re.compile(r"[0-9a-fA-F:.]+")


def _size(text: str) -> bool:
    """go-humanize's ParseBytes (DiskSize, ByteSize): a number and a unit it knows."""
    return bool(_SIZE.fullmatch(text))


def _signed_size(text: str) -> bool:
    """block.ByteSize: empty, or ParseBytes after an optional minus."""
    return text == "" or _size(text.removeprefix("-"))


def _matcher(text: str) -> bool:
    """InstallDiskSizeMatcher: an optional comparison, then a size."""
    m = _MATCHER.fullmatch(text)
    return m is not None and _size(m.group(2))


def _addr(text: str) -> bool:
    if text == "":
        return True
    if not _ADDR.fullmatch(text):
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _prefix(text: str) -> bool:
    if text == "":
        return True
    m = _PREFIX.fullmatch(text)
    if m is None or not _addr(m.group(1)):
        return False
    return int(m.group(2)) <= ipaddress.ip_address(m.group(1)).max_prefixlen


def _addr_port(text: str) -> bool:
    if text == "":
        return True
    m = _ADDR_PORT.fullmatch(text)
    return m is not None and _addr(m.group(1).strip("[]")) and int(m.group(2)) <= 65535 and \
        (":" in m.group(1)) == m.group(1).startswith("[")


def _mac(text: str) -> bool:
    return text == "" or bool(_MAC.fullmatch(text))


def _base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


#: Go type -> its text grammar (types with their own unmarshalers whose text is parsed, by name in the schema).
def _url(text: str) -> bool:
    """net/url's Parse (meta.URL, Endpoint): an absolute URL with a plain host, or a relative path."""
    return bool(_URL_ABSOLUTE.fullmatch(text) or _URL_RELATIVE.fullmatch(text))


_URL_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._~-]*)(:[0-9]*)?"
                           r"(/[A-Za-z0-9._~!$&'()*+,;=:@/-]*)?(\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?")
_URL_RELATIVE = re.compile(r"[A-Za-z0-9._~/-]*")


#: How the messages name what these types take.
_TEXT_WORDS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"meta.URL", "v1alpha1.Endpoint"}), "a URL such as https://host:6443"),
    (frozenset({"v1alpha1.DiskSize", "block.ByteSize", "block.Size"}), "a size such as 10GB or 512MiB"),
    (frozenset({"v1alpha1.InstallDiskSizeMatcher"}), "a size condition such as '>= 10GB'"),
    (frozenset({"netip.Addr", "network.Addr", "meta.Addr"}), "an IP address"),
    (frozenset({"netip.Prefix", "network.Prefix", "meta.Prefix"}), "an IP prefix such as 10.0.0.0/8"),
    (frozenset({"netip.AddrPort", "network.AddrPort", "meta.AddrPort"}), "an address and port such as 10.0.0.1:80"),
    (frozenset({"nethelpers.HardwareAddr"}), "a MAC address such as 00:11:22:33:44:55"),
    (frozenset({"v1alpha1.Base64Bytes"}), "base64 text"),
)

def _pem_key(text: str) -> bool:
    """A PEM key field: base64, or crypto's redaction marker (x509.Redacted), which its unmarshaler keeps."""
    return text == "******" or _base64(text)


#: Types whose own unmarshaler decodes each field from text whatever the Go field's type (siderolabs/crypto's
#: PEM types read ``crt`` and ``key`` into strings, then base64-decode them): field -> the text's grammar.
_FIELD_TEXT: dict[str, dict[str, Callable[[str], bool]]] = {
    "x509.PEMEncodedCertificate": {"crt": _base64},
    "x509.PEMEncodedCertificateAndKey": {"crt": _base64, "key": _pem_key},
    "x509.PEMEncodedKey": {"key": _pem_key},
}

_CONTENT: dict[str, Callable[[str], bool]] = {
    "meta.URL": _url,
    "v1alpha1.Endpoint": _url,
    "v1alpha1.DiskSize": _size,
    "block.ByteSize": _signed_size,
    "block.Size": _signed_size,  # a percentage ("50%") is refused here: a size in bytes only
    "v1alpha1.InstallDiskSizeMatcher": _matcher,
    "netip.Addr": _addr, "network.Addr": _addr, "meta.Addr": _addr,
    "netip.Prefix": _prefix, "network.Prefix": _prefix, "meta.Prefix": _prefix,
    "netip.AddrPort": _addr_port, "network.AddrPort": _addr_port, "meta.AddrPort": _addr_port,
    "nethelpers.HardwareAddr": _mac,
    "v1alpha1.Base64Bytes": _base64,
}


class InvalidConfigError(PatchError):
    """A document holds a field Talos does not know or a value of the wrong type.

    ``patch`` is where it was found (``cluster patch 2``, ``machine patch 1``, ``the patched configuration``),
    ``document`` the document as Talos names it, ``path`` the field (``machine.env``), ``detail`` what was
    expected and found."""

    def __init__(self, where: str, document: str, path: str, detail: str) -> None:
        self.document = document
        self.path = path
        self.detail = detail
        fix = "fix or remove the document" if path in ("kind", "apiVersion") else "fix or remove the field"
        super().__init__(where or "the configuration", f"{document}: {path or '(the document)'}: {detail}",
                         f"Talos's configuration decoder refuses it; {fix}")


@dataclass(frozen=True)
class Schema:
    contract: str
    documents: dict[str, dict[str, str]]
    types: dict[str, dict[str, Any]]

    def document_type(self, kind: str) -> dict[str, Any] | None:
        doc = self.documents.get(kind)
        return None if doc is None else self.types[doc["type"]]


@functools.cache
def schema_for(contract: VersionContract) -> Schema:
    """The decoder's schema of ``contract`` (a generated file per contract)."""
    name = f"v{contract.major}.{contract.minor}.json"
    try:
        text = resources.files("ichord.render").joinpath("schema").joinpath(name).read_text()
    except FileNotFoundError:
        raise RenderError(f"this version of ichord has no schema of Talos {contract}'s configuration "
                          "documents") from None
    data = json.loads(text)
    for t in data["types"].values():
        # Sets for the walk (a control plane's configuration is a few thousand values, checked per render).
        t["accepts"] = frozenset(t["accepts"])
        t["any_text"] = t["accepts"] >= STRING_PROBES and not t.get("custom")
    return Schema(str(data["contract"]), data["documents"], data["types"])


def probe_class(value: Any) -> str:
    """The probe a value is judged by (what go-yaml sees once ichord has encoded it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "negint" if value < 0 else "zero" if value == 0 else "int"
    if isinstance(value, float):
        return "floatint" if math.isfinite(value) and value.is_integer() else "float"
    if isinstance(value, dict):
        return "map" if value else "emptymap"
    if isinstance(value, list):
        if not value:
            return "emptyseq"
        if any(isinstance(v, dict) for v in value):
            return "seqmap"
        return "seqseq" if any(isinstance(v, list) for v in value) else "seq"
    text = str(value)
    for cls, pattern in (("s_empty", None), ("s_yes", _YES_NO), ("s_true", _TRUE_FALSE), ("s_int", _INT),
                         ("s_dur", _DURATION), ("s_cidr", _CIDR), ("s_ip", _IP), ("s_url", _URL)):
        if (pattern is None and text == "") or (pattern is not None and pattern.match(text)):
            return cls
    return "s_word"


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return "a string"


def _expected(t: dict[str, Any]) -> str:
    """What a type takes, in words, from the schema (the Go type in parentheses)."""
    go = str(t["go"])
    kind = t["kind"]
    accepts = set(t["accepts"])
    if go == "time.Duration":
        return "a duration such as 30s or 5m (time.Duration)"
    if t.get("enum"):
        names = list(t["enum"])
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        return f"one of {shown} ({go})"
    if go == "bool":
        return "a boolean, true or false (bool)"
    for names_, words_ in _TEXT_WORDS:
        if go in names_:
            return f"{words_} ({go})"
    if not t.get("custom") and kind in ("struct", "map"):
        return f"a mapping ({go})"
    if not t.get("custom") and kind == "slice":
        return f"a list ({go})"
    words = []
    takes_text = bool(accepts & STRING_PROBES) and (kind != "scalar" or bool(t.get("custom")))
    if takes_text or "s_word" in accepts:
        words.append("a string")
    if "int" in accepts and "s_word" not in accepts:
        words.append("an integer")
    if "emptymap" in accepts:
        words.append("a mapping")
    if "emptyseq" in accepts:
        words.append("a list")
    return f"{' or '.join(words) or 'null'} ({go})"


@dataclass(frozen=True)
class Problem:
    path: str
    message: str


class _Checker:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema

    def check(self, value: Any, t: dict[str, Any], path: str) -> Iterator[Problem]:
        kind = t["kind"]
        if kind == "any" or (isinstance(value, str) and t["any_text"]):
            return  # a plain string field (go-yaml takes any text into it): most of a configuration
        accepts = t["accepts"]
        cls = probe_class(value)
        if isinstance(value, dict):
            if cls not in accepts and "emptymap" not in accepts:
                yield Problem(path, f"expected {_expected(t)}, found {_shape(value)}")
                return
            if t.get("custom") and str(t["go"]) in _FIELD_TEXT:
                yield from self._field_text(value, t, path)
            elif t.get("custom"):
                # Its own unmarshaler decodes the values; CheckUnknownKeys still walks the keys by the Go fields.
                yield from self._keys(value, t, path)
            elif kind == "struct":
                yield from self._struct(value, t, path)
            elif kind == "map":
                elem = self.schema.types[t["elem"]]
                for k, v in value.items():
                    yield from self.check(v, elem, f"{path}.{k}" if path else str(k))
            return
        if isinstance(value, list):
            if cls not in accepts and "emptyseq" not in accepts:
                yield Problem(path, f"expected {_expected(t)}, found {_shape(value)}")
                return
            if kind == "slice" and "elem" in t and (not t.get("custom") or self._decodes_elements(cls, t)):
                elem = self.schema.types[t["elem"]]
                for i, v in enumerate(value):
                    yield from self.check(v, elem, f"{path}[{i}]")
            elif cls not in accepts:
                # Its own unmarshaler takes some lists (of strings, say) but not this one's elements.
                what = {"seqmap": "mappings", "seqseq": "lists"}.get(cls, "values")
                yield Problem(path, f"expected {_expected(t)}, found a list of {what}")
            elif t.get("custom"):
                yield from self._keys(value, t, path)
            return
        if value is None:
            if "null" not in accepts:
                yield Problem(path, f"expected {_expected(t)}, found null")
            return
        if not self._scalar_ok(value, cls, t):
            yield Problem(path, f"expected {_expected(t)}, found {_shape(value)} ({_show(value)})")

    def _decodes_elements(self, cls: str, t: dict[str, Any]) -> bool:
        """A list type with its own unmarshaler that takes a list of mappings (Talos's verdict on ``[{}]``) and
        decodes it into its Go element type, as v1alpha1.ClusterInlineManifests does: its elements are checked as
        that element type. (Its verdict on ``seqmap`` is no help: that probe's key is unknown to every struct.)"""
        return cls == "seqmap" and "seqemptymap" in t["accepts"]

    def _field_text(self, value: dict[str, Any], t: dict[str, Any], path: str) -> Iterator[Problem]:
        """A type whose unmarshaler reads every field as text (``_FIELD_TEXT``): known keys, scalar values whose
        text (as go-yaml sees ichord's encoding of them) the field's grammar takes."""
        grammar = _FIELD_TEXT[str(t["go"])]
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            check = grammar.get(str(k))
            if check is None:
                yield Problem(sub, f"unknown field (the fields of {t['go']} are {_known(dict.fromkeys(grammar, ''))})")
            elif isinstance(v, dict | list):
                yield Problem(sub, f"expected base64 text ({t['go']}), found {_shape(v)}")
            elif not check(_scalar_text(v)):
                yield Problem(sub, f"expected base64 text ({t['go']}), found {_shape(v)} ({_show(v)})")

    def _scalar_ok(self, value: Any, cls: str, t: dict[str, Any]) -> bool:
        accepts = t["accepts"]
        enum = t.get("enum")
        if enum and isinstance(value, str):
            return value in enum
        grammar = _CONTENT.get(str(t["go"])) if t.get("custom") else None
        if grammar is not None and isinstance(value, str):
            return grammar(value)  # the text a type's own parser takes (a size, an address)
        if cls not in accepts:
            return False
        if t.get("bits") and isinstance(value, int | float) and not isinstance(value, bool):
            number = int(value)
            bits = int(t["bits"])
            low, high = (0, (1 << bits) - 1) if t.get("unsigned") else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
            if not low <= number <= high:
                return False
        return True

    def _keys(self, value: Any, t: dict[str, Any], path: str) -> Iterator[Problem]:
        """CheckUnknownKeys alone (under a type with its own unmarshaler): keys by the Go fields, no value types."""
        kind = t["kind"]
        if kind == "any":
            return
        if isinstance(value, dict):
            if kind == "map" or t.get("open"):
                ref = str(t.get("elem") or t.get("open"))
                for k, v in value.items():
                    yield from self._keys(v, self.schema.types[ref], f"{path}.{k}" if path else str(k))
            elif kind == "struct" and t.get("fields") is not None:
                for k, v in value.items():
                    sub = f"{path}.{k}" if path else str(k)
                    ref = t["fields"].get(str(k))
                    if ref is None:
                        yield Problem(sub, f"unknown field (the fields of {t['go']} are {_known(t['fields'])})")
                    else:
                        yield from self._keys(v, self.schema.types[ref], sub)
            elif not t.get("custom"):
                yield Problem(path, f"expected {_expected(t)}, found a mapping")
        elif isinstance(value, list) and kind == "slice" and "elem" in t:
            for i, v in enumerate(value):
                yield from self._keys(v, self.schema.types[t["elem"]], f"{path}[{i}]")

    def _struct(self, value: dict[str, Any], t: dict[str, Any], path: str) -> Iterator[Problem]:
        fields: dict[str, str] | None = t.get("fields")
        open_elem = t.get("open")
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if open_elem:
                yield from self.check(v, self.schema.types[open_elem], sub)
                continue
            ref = (fields or {}).get(str(k))
            if ref is None:
                yield Problem(sub, f"unknown field (the fields of {t['go']} are {_known(fields)})")
                continue
            yield from self.check(v, self.schema.types[ref], sub)


def _known(fields: dict[str, str] | None) -> str:
    names = sorted(fields or {})
    shown = ", ".join(names[:12])
    return shown + (f", and {len(names) - 12} more" if len(names) > 12 else "") if names else "none"


def _scalar_text(value: Any) -> str:
    """The text go-yaml reads into a string from a scalar as ichord encodes it (render/wire.py)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return wire.encode([value]).decode().strip()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def document_label(doc: dict[str, Any]) -> str:
    """``v1alpha1`` for the legacy document, else ``Kind name (apiVersion v)`` as Talos identifies it."""
    if "kind" not in doc and "apiVersion" not in doc:
        return "the v1alpha1 document"
    name = doc.get("name")
    named = f" {name}" if name not in (None, "") else ""
    return f"document {doc.get('kind')}{named} (apiVersion {doc.get('apiVersion')})"


def check_document(doc: dict[str, Any], contract: VersionContract, where: str = "") -> None:
    """Raise InvalidConfigError naming the first field of ``doc`` Talos's decoder refuses."""
    problem = next(iter(document_problems(doc, contract)), None)
    if problem is not None:
        raise InvalidConfigError(where, document_label(doc), problem.path, problem.message)


def document_problems(doc: dict[str, Any], contract: VersionContract) -> Iterator[Problem]:
    schema = schema_for(contract)
    if "kind" not in doc and "apiVersion" not in doc:
        body = {k: v for k, v in doc.items() if k != "version"}
        t = schema.document_type(V1ALPHA1)
        if t is None:  # pragma: no cover - every schema has the v1alpha1 document
            raise RenderError(f"the schema of {contract} has no v1alpha1 document")
        if "version" in doc and doc["version"] != V1ALPHA1:
            yield Problem("version", f"expected v1alpha1, found {_show(doc['version'])}")
        yield from _Checker(schema).check(body, t, "")
        return
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    t = schema.document_type(str(kind)) if isinstance(kind, str) else None
    if t is None:
        yield Problem("kind", f"Talos {contract} knows no document kind {kind!r}")
        return
    expected = schema.documents[str(kind)].get("apiVersion")
    if api_version != expected:
        yield Problem("apiVersion", f"expected {expected}, found {_show(api_version)}")
        return
    yield from _Checker(schema).check(doc, t, "")


def check_config(config: MachineConfig, contract: VersionContract, where: str = "") -> None:
    """Every document of ``config`` decodes in Talos ``contract``'s decoder, or InvalidConfigError."""
    for doc in config.documents:
        check_document(doc, contract, where)
