"""The two writes a ca-rotation makes to the bundle Secret, each an update that fails if the Secret changed.

1. ``save_rotation``: rotation.yaml (the new CAs, keys included) before any node is told anything;
   a rotation.yaml already there is adopted, never overwritten (a start that died after the save).
2. ``replace_bundle``: in Finalizing, the new CAs go into secrets.yaml and rotation.yaml is removed,
   in one update.
3. ``remove_rotation``: an abandoned rotation (docs/decisions.md#abandon-or-hold) takes rotation.yaml out, nothing else.

Both PUT the object as read, carrying its resourceVersion, so a concurrent change makes the server
refuse (409) instead of one write silently undoing another. Only the Secret ``spec.secretsRef``
names, in the controller namespace, is ever written (docs/decisions.md#rotation-state).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any

from ichord.api import names
from ichord.errors import IchordError
from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict, Forbidden, KubeError, translate
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.pki.scrub import SCRUBBER


class BundleSecretError(IchordError):
    """The bundle Secret could not be written; the step is retried on a fresh read."""


@dataclass(frozen=True)
class Saved:
    rotation: Rotation
    adopted: bool  # rotation.yaml was already there (a start that died between the save and the stage)


def _path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{name}"


async def _get(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    with translate():
        obj: dict[str, Any] = await kube.raw("GET", _path(namespace, name))
    return obj


async def _put(kube: KubeClient, namespace: str, name: str, obj: dict[str, Any]) -> None:
    try:
        with translate():
            await kube.raw("PUT", _path(namespace, name), body=obj)
    except Conflict:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} changed while it was written; "
                                "the step runs again on a fresh read") from None
    except Forbidden:
        raise  # the operation's condition names the refused grant (backbone.forbidden)
    except KubeError as exc:
        raise BundleSecretError(f"cannot write the bundle Secret {namespace}/{name}: "
                                f"{SCRUBBER.exception(exc)}") from None


def _decode(obj: dict[str, Any], key: str) -> bytes | None:
    raw = (obj.get("data") or {}).get(key)
    return None if raw is None else base64.b64decode(raw)


async def save_rotation(kube: KubeClient, namespace: str, name: str, targets: tuple[Target, ...],
                        *, generate: Any = generate_rotation) -> Saved:
    """Adopt rotation.yaml when present, else generate the new CAs and add it (failing if the Secret changed)."""
    obj = await _get(kube, namespace, name)
    existing = _decode(obj, names.ROTATION_KEY)
    if existing is not None:
        return Saved(Rotation.from_yaml(existing), adopted=True)
    rotation: Rotation = generate(targets)
    SCRUBBER.register_all(ca.key_pem for ca in rotation.new.values() if ca.key_pem)
    body = copy.deepcopy(obj)
    body.setdefault("data", {})[names.ROTATION_KEY] = base64.b64encode(rotation.to_yaml().encode()).decode()
    await _put(kube, namespace, name, body)
    return Saved(rotation, adopted=False)


async def replace_bundle(kube: KubeClient, namespace: str, name: str, bundle: SecretsBundle,
                         rotation: Rotation, resource_version: str) -> SecretsBundle:
    """secrets.yaml := the bundle with the new CAs, rotation.yaml removed; one update, refused if the Secret
    changed since ``resource_version`` (the read the step decided on)."""
    obj = await _get(kube, namespace, name)
    if str(obj["metadata"].get("resourceVersion")) != resource_version:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} changed since it was read; "
                                "the step runs again on a fresh read")
    replaced = rotation.apply_to(bundle)
    body = copy.deepcopy(obj)
    data = body.setdefault("data", {})
    data[names.SECRETS_KEY] = base64.b64encode(replaced.to_yaml().encode()).decode()
    data.pop(names.ROTATION_KEY, None)
    await _put(kube, namespace, name, body)
    return replaced


async def remove_rotation(kube: KubeClient, namespace: str, name: str, resource_version: str) -> bool:
    """Abandon (docs/decisions.md#abandon-or-hold): rotation.yaml removed, secrets.yaml untouched; one update, refused
    if the Secret changed since ``resource_version``. False when there was none to remove."""
    obj = await _get(kube, namespace, name)
    if names.ROTATION_KEY not in (obj.get("data") or {}):
        return False
    if str(obj["metadata"].get("resourceVersion")) != resource_version:
        raise BundleSecretError(f"the bundle Secret {namespace}/{name} changed since it was read; "
                                "the step runs again on a fresh read")
    body = copy.deepcopy(obj)
    body["data"].pop(names.ROTATION_KEY, None)
    # The keys leave with rotation.yaml: the custody finalizer (custody.py) goes in the same update.
    finalizers = [f for f in body["metadata"].get("finalizers") or [] if f != names.BUNDLE_CUSTODY_FINALIZER]
    body["metadata"]["finalizers"] = finalizers or None
    await _put(kube, namespace, name, body)
    return True
