"""In-memory object storage with the API server's write semantics.

One global resourceVersion counter (like etcd's revision), optimistic concurrency on update,
generation bumps on spec changes only, the status subresource kept apart, finalizers holding a
deletion, delete preconditions, and CRD schema pruning/defaulting/validation.
"""

from __future__ import annotations

import base64
import builtins
import datetime as dt
import secrets
import uuid
from collections.abc import Callable
from typing import Any

from ichord.jsoncopy import copy_json
from ichord.sim.kube import apply as _apply
from ichord.sim.kube import patch as _patch
from ichord.sim.kube import schema as _schema
from ichord.sim.kube.events import Change, EventLog, Watcher
from ichord.sim.kube.fieldvalidation import FieldValidation, apply_refusal, patched_json
from ichord.sim.kube.resources import BUILTINS, JSON, ResourceType, types_from_crd
from ichord.sim.kube.status import (
    STALE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
    unsupported_media,
)

Listener = Callable[[Change, ResourceType], None]
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self, *, window: int = 5000, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.rv = 0
        self.log = EventLog(window)
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], JSON]] = {}
        self.listeners: list[Listener] = []
        self.apply_owners: dict[str, _apply.Owners] = {}  # server-side apply's field owners, by object uid
        for rt in BUILTINS:
            self.register(rt)

    # -- types -------------------------------------------------------------------------------
    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self.objects.setdefault(rt.key, {})

    def unregister_crd(self, crd: JSON) -> None:
        for rt in types_from_crd(crd):
            self.types.pop((rt.group, rt.version, rt.plural), None)
            self.objects.pop(rt.key, None)

    def resolve(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def by_kind(self, group: str, kind: str) -> ResourceType:
        for rt in self.types.values():
            if rt.group == group and rt.kind == kind:
                return rt
        raise KeyError(f"{kind}.{group}")

    def groups(self) -> dict[str, list[ResourceType]]:
        out: dict[str, list[ResourceType]] = {}
        for rt in self.types.values():
            out.setdefault(rt.api_version, []).append(rt)
        return out

    # -- reads -------------------------------------------------------------------------------
    def _bucket(self, rt: ResourceType) -> dict[tuple[str, str], JSON]:
        return self.objects.setdefault(rt.key, {})

    def _ns(self, rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def _present(self, rt: ResourceType, obj: JSON) -> JSON:
        out = copy_json(obj)
        out["apiVersion"], out["kind"] = rt.api_version, rt.kind
        return out

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._bucket(rt).get((self._ns(rt, namespace), name))
        if obj is None:
            raise not_found(rt, name)
        return self._present(rt, obj)

    def list(self, rt: ResourceType, namespace: str | None,
             predicate: Callable[[JSON], bool] = lambda _o: True) -> tuple[list[JSON], int]:
        items = [self._present(rt, o) for (ns, _n), o in sorted(self._bucket(rt).items())
                 if (namespace is None or ns == namespace) and predicate(o)]
        return items, self.rv

    def peek(self, rt: ResourceType, namespace: str | None) -> builtins.list[JSON]:
        """The stored objects themselves, not copies, in list order: for the simulator's own behaviours that only
        read them within one synchronous step (a copy of every Node per pod sync dominated a wide pass's CPU).
        Never hand them to a client and never change them: every write goes through the store's verbs."""
        return [o for (ns, _n), o in sorted(self._bucket(rt).items()) if namespace is None or ns == namespace]

    def peek_object(self, rt: ResourceType, namespace: str | None, name: str) -> JSON | None:
        """One stored object itself (the rules of ``peek``), or None."""
        return self._bucket(rt).get((self._ns(rt, namespace), name))

    def watch(self, rt: ResourceType, namespace: str | None, since: str | None,
              predicate: Callable[[JSON], bool]) -> Watcher:
        watcher = Watcher(rt.key, namespace, predicate)
        if since in (None, "", "0"):
            # No resourceVersion: synthetic ADDED events for the current state, then follow.
            for obj in self.list(rt, namespace, predicate)[0]:
                watcher.queue.put_nowait(("ADDED", obj))
            self.log.watchers.append(watcher)
            return watcher
        try:
            since_rv = int(since or "0")
        except ValueError:
            raise bad_request(f"invalid resource version {since!r}") from None
        self.log.subscribe(watcher, since_rv)
        return watcher

    # -- writes ------------------------------------------------------------------------------
    def _commit(self, rt: ResourceType, kind: str, new: JSON, old: JSON | None) -> JSON:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        key = (new["metadata"].get("namespace", ""), new["metadata"]["name"])
        if kind == "DELETED":
            self._bucket(rt).pop(key, None)
            if rt.key == CRD_KEY:
                self.unregister_crd(new)  # a deleted CRD stops serving its resources, objects included
        else:
            self._bucket(rt)[key] = new
        change = Change(self.rv, rt.key, key[0], kind, self._present(rt, new),
                        self._present(rt, old) if old is not None else None)
        self.log.append(change)
        for listener in list(self.listeners):
            listener(change, rt)
        return self._present(rt, new)

    def create(self, rt: ResourceType, namespace: str | None, body: JSON, *,
               validation: FieldValidation | None = None) -> JSON:
        obj = copy_json(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name") or ""
        if not name:
            raise invalid(rt, "", [("FieldValueRequired", "metadata.name",
                                    "Required value: name or generateName is required")])
        ns = self._ns(rt, namespace or meta.get("namespace"))
        if rt.namespaced:
            if not ns:
                raise bad_request("the namespace of the provided object does not match the namespace sent on "
                                  "the request")
            if ("", ns) not in self._bucket(self.resolve("", "v1", "namespaces")):
                raise not_found(self.resolve("", "v1", "namespaces"), ns)
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if (ns, name) in self._bucket(rt):
            raise already_exists(rt, name)
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        if rt.generation:
            meta["generation"] = 1
        if rt.custom and "status" in rt.subresources:
            obj.pop("status", None)
        if rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        self._admit(rt, obj, None, validation)
        return self._commit(rt, "ADDED", obj, None)

    def _admit(self, rt: ResourceType, obj: JSON, old: JSON | None, validation: FieldValidation | None = None) -> None:
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if rt.key == ("", "secrets") and not obj.get("type"):
            obj["type"] = "Opaque"  # SetDefaults_Secret (kubectl create secret generic sends none)
        if rt.key == ("", "secrets") and "stringData" in obj:
            # Like the API server: stringData is write-only, merged into data (base64) on every write.
            data = obj.setdefault("data", {}) or {}
            for key, value in (obj.pop("stringData") or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data
        if rt.custom and rt.schema is not None:
            if validation is not None:  # a client's request; the simulator's own writes are not validated
                validation.unknown(rt, _schema.unknown_fields(obj, rt.schema))
            _schema.prune_and_default(obj, rt.schema)
            causes = _schema.validate(obj, rt.schema, "", old)
            if causes:
                raise invalid(rt, obj["metadata"].get("name", ""), causes)
        if rt.key == CRD_KEY:
            try:
                new_types = types_from_crd(obj)
            except (KeyError, TypeError) as exc:
                raise invalid(rt, obj["metadata"].get("name", ""),
                              [("FieldValueRequired", "spec", f"Required value: {exc}")]) from None
            for nt in new_types:
                self.register(nt)

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: JSON,
               subresource: str | None = None, *, validation: FieldValidation | None = None) -> JSON:
        ns = self._ns(rt, namespace)
        old = self._bucket(rt).get((ns, name))
        if old is None:
            raise not_found(rt, name)
        obj = copy_json(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                              f"({name})")
        want_rv = meta.get("resourceVersion")
        if want_rv and want_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name, STALE)
        if not want_rv and rt.custom and subresource is None:
            raise invalid(rt, name, [("FieldValueInvalid", "metadata.resourceVersion",
                                      "Invalid value: 0x0: must be specified for an update")])
        return self._write(rt, old, obj, subresource, validation)

    def _write(self, rt: ResourceType, old: JSON, obj: JSON, subresource: str | None,
               validation: FieldValidation | None = None) -> JSON:
        name = old["metadata"]["name"]
        if subresource == "status":
            merged = {k: copy_json(v) for k, v in old.items() if k != "status"}  # the old status is replaced
            if "status" in obj:
                merged["status"] = obj["status"]
            else:
                merged.pop("status", None)
            obj = merged
        else:
            meta = obj["metadata"]
            for field in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation"):
                if field in old["metadata"]:
                    meta[field] = old["metadata"][field]
                else:
                    meta.pop(field, None)
            if "status" in rt.subresources:
                if "status" in old:
                    obj["status"] = copy_json(old["status"])
                else:
                    obj.pop("status", None)
            if old["metadata"].get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
                if added:
                    raise invalid(rt, name, [("FieldValueForbidden", "metadata.finalizers",
                                              "Forbidden: no new finalizers can be added if the object "
                                              "is being deleted")])
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        self._admit(rt, obj, old, validation)
        if rt.generation and _spec_of(obj) != _spec_of(old):
            obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if obj == old:
            return self._present(rt, old)  # a no-op write changes nothing, not even the resourceVersion
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            return self._commit(rt, "DELETED", obj, old)
        return self._commit(rt, "MODIFIED", obj, old)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, content_type: str, body: Any,
              subresource: str | None = None, *, validation: FieldValidation | None = None) -> JSON:
        ns = self._ns(rt, namespace)
        old = self._bucket(rt).get((ns, name))
        if old is None:
            raise not_found(rt, name)
        try:
            if content_type == _patch.MERGE_PATCH:
                # merge_patch copies what it is given: the stored object, as presented, need not be copied first.
                new = _patch.merge_patch({**old, "apiVersion": rt.api_version, "kind": rt.kind}, body)
            elif content_type == _patch.JSON_PATCH:
                new = _patch.json_patch(self._present(rt, old), body)
            elif content_type == _patch.STRATEGIC_MERGE_PATCH and not rt.custom:
                new = _patch.strategic_merge_patch(self._present(rt, old), body)
            else:
                raise unsupported_media(content_type)
        except _patch.PatchError as exc:
            if content_type == _patch.JSON_PATCH:  # kube-apiserver names no cause for a JSON patch that fails
                raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                               {}) from None
            raise invalid(rt, name, [("FieldValueInvalid", "", str(exc))]) from None
        if not isinstance(new, dict):
            raise bad_request("the patch must produce an object")
        new.setdefault("metadata", {})
        want_rv = new["metadata"].get("resourceVersion")
        if want_rv and want_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name, STALE)
        if validation is not None and validation.directive == "Strict":
            validation.patched = patched_json(new)  # what a strict refusal of a patch shows
        return self._write(rt, old, new, subresource, validation)

    def server_side_apply(self, rt: ResourceType, namespace: str | None, name: str, body: Any,
                          field_manager: str | None, force: bool = False, subresource: str | None = None, *,
                          validation: FieldValidation | None = None) -> tuple[JSON, bool]:
        """Server-side apply (apply.py): the object, and whether the apply created it."""
        old = self._bucket(rt).get((self._ns(rt, namespace), name))
        if not field_manager:
            raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                           "required for apply patch", {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
                               {"reason": "FieldValueRequired", "message": "Required value: is required for apply "
                                "patch", "field": "fieldManager"}]})
        if not isinstance(body, dict):
            raise bad_request("the body of an apply patch must be an object")
        if rt.custom and rt.schema is not None:  # whatever the directive: the typed configuration cannot be made
            unknown = _schema.unknown_fields(body, rt.schema)
            if unknown:
                raise apply_refusal(rt, body, name, unknown[0])
        if old is None:
            owners = _apply.Owners()
            created = self.create(rt, namespace, _apply.apply(None, {**body, "metadata": {
                **(body.get("metadata") or {}), "name": name}}, field_manager, force, owners), validation=validation)
            self.apply_owners[created["metadata"]["uid"]] = owners
            return created, True
        owners = self.apply_owners.setdefault(old["metadata"]["uid"], _apply.Owners())
        trial = _apply.Owners({m: set(p) for m, p in owners.by_manager.items()})
        new = _apply.apply(self._present(rt, old), body, field_manager, force, trial)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        written = self._write(rt, old, new, subresource, validation)
        owners.by_manager = trial.by_manager  # ownership changes only with a write that succeeded
        return written, False

    def delete(self, rt: ResourceType, namespace: str | None, name: str,
               preconditions: JSON | None = None) -> tuple[JSON, bool]:
        """Delete or mark for deletion; returns (object, gone now)."""
        ns = self._ns(rt, namespace)
        old = self._bucket(rt).get((ns, name))
        if old is None:
            raise not_found(rt, name)
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                           f"meta: {old['metadata']['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                           f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                           f"{old['metadata']['resourceVersion']}")
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return self._present(rt, old), False
            new = copy_json(old)
            new["metadata"]["deletionTimestamp"] = rfc3339(self.clock())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt.generation:
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            return self._commit(rt, "MODIFIED", new, old), False
        if rt.plural == "namespaces":
            for other in self.types.values():
                if other.namespaced:
                    for (ons, oname) in [k for k in self._bucket(other) if k[0] == name]:
                        self.delete(other, ons, oname)
        return self._commit(rt, "DELETED", copy_json(old), old), True

    # -- conveniences for behaviours and tests --------------------------------------------------
    def apply(self, rt: ResourceType, obj: JSON, subresource: str | None = None) -> JSON:
        """Create or overwrite unconditionally (the cluster's own controllers writing)."""
        meta = obj["metadata"]
        existing = self._bucket(rt).get((self._ns(rt, meta.get("namespace")), meta["name"]))
        if existing is None:
            return self.create(rt, meta.get("namespace"), obj)
        body = copy_json(obj)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self._write(rt, existing, body, subresource)

    def load_crd(self, crd: JSON) -> JSON:
        return self.apply(self.resolve(CRD_KEY[0], "v1", CRD_KEY[1]), crd)


def _spec_of(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
