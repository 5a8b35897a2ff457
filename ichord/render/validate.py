"""Cheap runtime structural checks of a rendered configuration (the JSON schema is a test-only asset).

What a machine would refuse or what would be unsafe is caught here, before anything is applied:
one v1alpha1 document with a valid machine.type, well-formed typed documents without duplicates,
no legacy CA field beside the document that replaces it (Talos's API definitions), and no CA private
key on a worker.
"""

from __future__ import annotations

from typing import Any

from ichord.render.config import V1ALPHA1, MachineConfig, doc_key, doc_label
from ichord.render.errors import RenderError

MACHINE_TYPES = ("controlplane", "worker")

#: (document kind, v1alpha1 path) pairs Talos's validation rejects together.
CONFLICTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("KubeAPIServerCAConfig", ("cluster", "ca")),
    ("KubeAggregatorCAConfig", ("cluster", "aggregatorCA")),
)


def _get(doc: Any, path: tuple[str, ...]) -> Any:
    node = doc
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def check_structure(config: MachineConfig, role: str | None = None) -> None:
    """Raise RenderError naming the first structural defect of ``config``."""
    legacy = [d for d in config.documents if doc_key(d) == (V1ALPHA1, None)]
    if len(legacy) != 1:
        raise RenderError(
            f"the configuration has {len(legacy)} v1alpha1 documents; Talos needs exactly one. "
            "Check the patches for a document that removes or duplicates it"
        )
    v1 = legacy[0]
    machine_type = _get(v1, ("machine", "type"))
    if machine_type not in MACHINE_TYPES:
        raise RenderError(f"machine.type is {machine_type!r}; it must be controlplane or worker")
    if role is not None and machine_type != role:
        raise RenderError(f"machine.type is {machine_type} but the machine's role is {role}; "
                          "a patch must not change machine.type: set spec.role instead")
    seen: set[tuple[str, str | None]] = set()
    for doc in config.documents:
        if doc is v1:
            continue
        if not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
            raise RenderError("a document has no apiVersion or kind; every document but v1alpha1 needs both")
        key = doc_key(doc)
        if key in seen:
            raise RenderError(f"document {doc_label(key)} appears twice; merge the patches that add it")
        seen.add(key)
    kinds = {k for k, _ in seen}
    for kind, path in CONFLICTS:
        if kind in kinds and _get(v1, path):
            raise RenderError(
                f"{'.'.join(path)} in the v1alpha1 document conflicts with the {kind} document; "
                f"keep only one (the {kind} document for contract v1.14, {'.'.join(path)} for v1.13)"
            )
    if machine_type == "worker":
        _check_worker_keys(config, v1)


def _check_worker_keys(config: MachineConfig, v1: Any) -> None:
    """Workers never hold a CA private key (Talos generates them with ``key: ""``)."""
    for path in (("machine", "ca"), ("cluster", "ca"), ("cluster", "aggregatorCA"), ("cluster", "etcd", "ca")):
        if _get(v1, (*path, "key")):
            raise RenderError(f"{'.'.join(path)}.key is set on a worker; workers must never hold a CA key. "
                              "Remove it from the patches")
    if _get(v1, ("cluster", "serviceAccount", "key")):
        raise RenderError("cluster.serviceAccount.key is set on a worker; remove it from the patches")
    for doc in config.documents:
        kind = doc.get("kind")
        if kind in ("KubeAPIServerCAConfig", "KubeAggregatorCAConfig") and _get(doc, ("issuingCA", "key")):
            raise RenderError(f"{kind} issuingCA.key is set on a worker; workers must never hold a CA key. "
                              "Remove it from the patches")
        if kind == "KubeServiceAccountConfig" and _get(doc, ("issuer", "privateKey")):
            raise RenderError("KubeServiceAccountConfig issuer.privateKey is set on a worker; "
                              "remove it from the patches")
