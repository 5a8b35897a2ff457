"""``ichord cluster restore-bundle``: the bundle Secret put back from a rotation's custody copy (custody.py).

The one command a ca-rotation's BundleRestoreRequired condition names. It finds the cluster's rotation under way,
reads its custody copy (refusing one that is not the operation's, or whose new CAs are not the ones status names)
and writes the bundle Secret the rotation needs at its stage:

    Accepting .. Dropping   secrets.yaml as the rotation started from it, and its rotation.yaml (same new CAs)
    Finalizing, Done        secrets.yaml with the new CAs (what the replacement wrote), no rotation.yaml

A missing Secret is created; one replaced (an older secrets.yaml, rotation.yaml gone or different) is updated
(carrying its resourceVersion: a concurrent change is refused, never overwritten); one being deleted and held
only by the custody finalizer is let go, awaited, and created again (labels, annotations and other keys kept). A
Secret that already holds it is left alone. Every write carries the bundle label and the custody finalizer. Key
material is never printed: fingerprints only.

Errors: ``RestoreRefused`` (bad input: no such cluster, no rotation under way, a secretsRef that moved; nothing is
written; exit 2) and ``RestoreFailed`` (the copy is missing or not trustworthy, the Secret cannot be written;
exit 1).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass

import anyio

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.views import ClusterView, OperationView, operations_of
from ichord.errors import IchordError
from ichord.failpoints import failpoint
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import KubeError, NotFound, translate
from ichord.operations.ca_rotation.custody import FINALIZER, Kept, copy_name, get_secret, read_copy
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import RotationError
from ichord.pki.scrub import SCRUBBER

Obj = dict[str, object]


class RestoreRefused(IchordError):
    """Bad input: nothing to restore for what was named; nothing was written."""


class RestoreFailed(IchordError):
    """The restore could not be done; the message says what was (not) written and what to do."""


@dataclass(frozen=True)
class Restored:
    secret: str  # namespace/name of the bundle Secret
    operation: str  # namespace/name of the rotation
    copy: str  # namespace/name of the custody copy
    stage: str
    action: str  # created | updated | recreated | unchanged
    fingerprints: tuple[str, ...]  # "name=sha256" of the rotation's new CAs


async def _rotation_of(kube: KubeClient, namespace: str, cluster: str) -> OperationView:
    objs, _ = await crds.operations(kube).list_objects(namespace)
    under_way = [op for op in operations_of(objs, namespace, cluster)
                 if op.kind == names.KIND_CA_ROTATION and op.stage and op.phase != names.Phase.COMPLETED]
    if not under_way:
        raise RestoreRefused(f"no ca-rotation of TalosCluster {namespace}/{cluster} is under way: restore-bundle puts "
                             "back the bundle Secret a rotation lost, from the rotation's custody copy. Nothing was "
                             "written")
    return under_way[0]


def _checked(kept: Kept | None, op: OperationView) -> Kept:
    where = f"Secret {op.namespace}/{copy_name(op.uid)}"
    if kept is None:
        raise RestoreFailed(f"the custody copy {where} of TalosOperation {op.namespace}/{op.name} does not exist (or "
                            "is not that operation's); restore the bundle Secret from your own backup of it. Nothing "
                            "was written")
    try:
        rotation = kept.rotation()
    except (RotationError, ValueError):
        rotation = None
    nexts = {str(c.get("name")): c.get("next") for c in (op.status.get("caRotation") or {}).get("certificates") or []}
    if rotation is None or not nexts or {t.value: ca_fingerprint(ca) for t, ca in rotation.new.items()} != nexts:
        raise RestoreFailed(f"the custody copy {where} does not hold the new CAs status.caRotation.certificates names; "
                            "it was not used. Nothing was written")
    return kept


def _fingerprints(op: OperationView) -> tuple[str, ...]:
    return tuple(f"{c.get('name')}={c.get('next')}"
                 for c in (op.status.get("caRotation") or {}).get("certificates") or [] if c.get("next"))


def _with(obj: Obj, want: dict[str, bytes | None], stage: Stage) -> Obj:
    body = copy.deepcopy(obj)
    meta = body.setdefault("metadata", {})
    assert isinstance(meta, dict)
    data = dict(body.get("data") or {})  # type: ignore[call-overload]
    for key, value in want.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = base64.b64encode(value).decode()
    body["data"] = data
    meta["labels"] = {**(meta.get("labels") or {}), names.BUNDLE_LABEL: "true"}
    finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
    meta["finalizers"] = [*finalizers, FINALIZER] if stage is not Stage.DONE else (finalizers or None)
    return body


def _holds(obj: Obj, want: dict[str, bytes | None], stage: Stage) -> bool:
    data = obj.get("data") or {}
    assert isinstance(data, dict)
    for key, value in want.items():
        have = data.get(key)
        if (None if have is None else base64.b64decode(str(have))) != value:
            return False
    meta = obj.get("metadata") or {}
    assert isinstance(meta, dict)
    return stage is Stage.DONE or FINALIZER in (meta.get("finalizers") or [])


def _path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


async def restore_bundle(kube: KubeClient, namespace: str, cluster_name: str, *, wait: float = 30.0) -> Restored:
    """Put the cluster's bundle Secret back from its rotation's custody copy (the whole command)."""
    try:
        cluster = ClusterView.of(await crds.clusters(kube).get(namespace, cluster_name))
    except NotFound:
        raise RestoreRefused(f"TalosCluster {namespace}/{cluster_name} not found; check the name and -n. Nothing was "
                             "written") from None
    if not cluster.secret_name:
        raise RestoreRefused(f"TalosCluster {cluster.key} has no spec.secretsRef.name. Nothing was written")
    op = await _rotation_of(kube, namespace, cluster_name)
    kept = _checked(await read_copy(kube, op.namespace, op.uid), op)
    secret_ns, secret_name = cluster.secret_namespace, cluster.secret_name
    if kept.bundle_name and (kept.bundle_namespace, kept.bundle_name) != (secret_ns, secret_name):
        raise RestoreRefused(f"TalosCluster {cluster.key}'s spec.secretsRef names Secret {secret_ns}/{secret_name}, "
                             f"but the rotation {op.name} started on Secret {kept.bundle_namespace}/"
                             f"{kept.bundle_name}; put spec.secretsRef back first. Nothing was written")
    stage = Stage.parse(op.stage)
    want = kept.restored(stage)
    result = dict(secret=f"{secret_ns}/{secret_name}", operation=f"{op.namespace}/{op.name}",
                  copy=f"{kept.namespace}/{kept.name}", stage=stage.value, fingerprints=_fingerprints(op))
    try:
        current = await get_secret(kube, secret_ns, secret_name)
        if current is None:
            await _create(kube, secret_ns, secret_name, want, stage, None)
            return Restored(action="created", **result)  # type: ignore[arg-type]
        meta = current.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            await _recreate(kube, secret_ns, secret_name, current, want, stage, wait)
            return Restored(action="recreated", **result)  # type: ignore[arg-type]
        if _holds(current, want, stage):
            return Restored(action="unchanged", **result)  # type: ignore[arg-type]
        with translate():
            await kube.raw("PUT", _path(secret_ns, secret_name), body=_with(current, want, stage))
        return Restored(action="updated", **result)  # type: ignore[arg-type]
    except KubeError as exc:
        raise RestoreFailed(f"cannot write the bundle Secret {secret_ns}/{secret_name}: {SCRUBBER.exception(exc)}; "
                            "run the command again") from None


async def _create(kube: KubeClient, namespace: str, name: str, want: dict[str, bytes | None], stage: Stage,
                  was: Obj | None) -> None:
    meta_was = (was or {}).get("metadata") or {}
    assert isinstance(meta_was, dict)
    body: Obj = {"apiVersion": "v1", "kind": "Secret", "type": (was or {}).get("type") or "Opaque",
                 "metadata": {"name": name, "namespace": namespace,
                              "labels": dict(meta_was.get("labels") or {}),
                              "annotations": dict(meta_was.get("annotations") or {}),
                              "finalizers": [f for f in meta_was.get("finalizers") or [] if f != FINALIZER]},
                 "data": dict((was or {}).get("data") or {})}  # type: ignore[call-overload]
    with translate():
        await kube.raw("POST", _path(namespace), body=_with(body, want, stage))


async def _recreate(kube: KubeClient, namespace: str, name: str, current: Obj, want: dict[str, bytes | None],
                    stage: Stage, wait: float) -> None:
    """A Secret being deleted is let go (only the custody finalizer may hold it), awaited, then created again."""
    meta = current.get("metadata") or {}
    assert isinstance(meta, dict)
    others = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
    if others:
        raise RestoreFailed(f"the bundle Secret {namespace}/{name} is being deleted and other finalizers hold it too "
                            f"({', '.join(others)}); it cannot be replaced until they are gone. Nothing was written")
    if FINALIZER in (meta.get("finalizers") or []):
        released = copy.deepcopy(current)
        released["metadata"]["finalizers"] = None  # type: ignore[index]
        with translate():
            await kube.raw("PUT", _path(namespace, name), body=released)
    failpoint("restore.released")
    with anyio.move_on_after(wait):
        while await get_secret(kube, namespace, name) is not None:  # noqa: ASYNC110 - a poll of the API server
            await anyio.sleep(0.2)
    if await get_secret(kube, namespace, name) is not None:
        raise RestoreFailed(f"the bundle Secret {namespace}/{name} is still being deleted after {wait:g} s; run the "
                            "command again")
    await _create(kube, namespace, name, want, stage, current)
