"""Validate rendered documents against Talos's config.schema.json (a test-only asset in ../shared).

The upstream schema documents only non-deprecated fields: it leaves out the `docgen:nodoc` fields
(`persist`, and the legacy v1alpha1 fields Talos's API definitions lists as deprecated but honoured),
which Talos's own generator still writes for contract v1.13 (stability/v1.13), and its
UnattendedInstallConfig definition names the kind `UnattendedInstall` while Talos's generator
writes `UnattendedInstallConfig` (stability/v1.14/overrides-*). The validator below admits exactly
those, with any content for the legacy fields, and checks everything else as the schema says.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

#: docgen:nodoc fields Talos generates, per v1alpha1 definition.
NODOC_FIELDS: dict[str, tuple[str, ...]] = {
    "v1alpha1.Config": ("persist",),
    "v1alpha1.MachineConfig": ("kubelet", "install", "sysctls", "nodeLabels"),
    "v1alpha1.FeaturesConfig": ("kubePrism", "hostDNS"),
    "v1alpha1.ClusterConfig": (
        "id", "secret", "controlPlane", "clusterName", "network", "secretboxEncryptionSecret",
        "aescbcEncryptionSecret", "ca", "acceptedCAs", "aggregatorCA", "serviceAccount", "apiServer",
        "controllerManager", "proxy", "scheduler", "discovery", "allowSchedulingOnControlPlanes",
    ),
}
#: (definition, kind the generator writes) where the schema's kind enum differs.
KIND_ALIASES = {"runtime.UnattendedInstallConfigV1Alpha1": "UnattendedInstallConfig"}


@cache
def _validators(schema_path: str) -> tuple[Any, dict[str, Any]]:
    schema = json.loads(Path(schema_path).read_text())
    defs = schema["$defs"]
    for name, fields in NODOC_FIELDS.items():
        for f in fields:
            defs[name]["properties"].setdefault(f, {})
    for name, kind in KIND_ALIASES.items():
        defs[name]["properties"]["kind"]["enum"].append(kind)
    cls = jsonschema.validators.validator_for(schema)
    by_kind: dict[str, Any] = {}
    legacy = None
    for name, definition in defs.items():
        root = copy.copy(schema)
        root.pop("oneOf", None)
        root["$ref"] = f"#/$defs/{name}"
        if name == "v1alpha1.Config":
            legacy = cls(root)
            continue
        for kind in definition.get("properties", {}).get("kind", {}).get("enum", []):
            by_kind[kind] = cls(root)
    assert legacy is not None
    return legacy, by_kind


def schema_errors(schema_path: Path, documents: list[dict[str, Any]]) -> list[str]:
    """Every schema violation of ``documents``, as "<document>: <path>: <message>" lines."""
    legacy, by_kind = _validators(str(schema_path))
    out = []
    for doc in documents:
        if "kind" not in doc:
            label, validator = "v1alpha1", legacy
        else:
            label = str(doc["kind"]) + (f" {doc['name']}" if "name" in doc else "")
            validator = by_kind.get(str(doc["kind"]))
            if validator is None:
                out.append(f"{label}: the schema has no document of this kind")
                continue
        for err in validator.iter_errors(doc):
            out.append(f"{label}: {'.'.join(str(p) for p in err.absolute_path)}: {err.message[:200]}")
    return out
