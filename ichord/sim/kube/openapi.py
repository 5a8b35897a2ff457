"""A minimal /openapi/v3 so kubectl's default validation works against the simulator.

kubectl apply asks /openapi/v3 whether the server supports the ``fieldValidation`` query parameter
(a PATCH operation tagged with the resource's group/version/kind that lists it); when it does,
kubectl leaves validation to the server (``fieldValidation=Strict``), which the store honours for
custom resources. CRD schemas are published as components so ``kubectl explain`` has them too.
"""

from __future__ import annotations

import hashlib
import json

from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.store import Store

_QUERY_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def _gv_path(api_version: str) -> str:
    return f"api/{api_version}" if "/" not in api_version else f"apis/{api_version}"


def _gvk(rt: ResourceType) -> JSON:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _schema_name(rt: ResourceType) -> str:
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


def document(store: Store, path: str) -> JSON | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["openapi", "v3"]:
        return None
    groups = store.groups()
    if len(parts) == 2:
        out: JSON = {}
        for api_version in sorted(groups):
            gv = _gv_path(api_version)
            digest = hashlib.sha256(json.dumps(_gv_document(groups[api_version]), sort_keys=True).encode())
            out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest.hexdigest()[:32].upper()}"}
        return {"paths": out}
    wanted = "/".join(parts[2:])
    for api_version, types in groups.items():
        if _gv_path(api_version) == wanted:
            return _gv_document(types)
    return None


def _gv_document(types: list[ResourceType]) -> JSON:
    paths: JSON = {}
    schemas: JSON = {}
    for rt in sorted(types, key=lambda t: t.plural):
        prefix = f"/{_gv_path(rt.api_version)}" + ("/namespaces/{namespace}" if rt.namespaced else "")
        params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}} for n in _QUERY_PARAMS]
        ref = {"$ref": f"#/components/schemas/{_schema_name(rt)}"}
        op = {"x-kubernetes-group-version-kind": _gvk(rt), "parameters": params,
              "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}}
        paths[f"{prefix}/{rt.plural}"] = {"post": {**op, "x-kubernetes-action": "post"},
                                          "get": {**op, "x-kubernetes-action": "list"}}
        paths[f"{prefix}/{rt.plural}/{{name}}"] = {"patch": {**op, "x-kubernetes-action": "patch"},
                                                   "put": {**op, "x-kubernetes-action": "put"},
                                                   "get": {**op, "x-kubernetes-action": "get"}}
        schema = dict(rt.schema) if rt.schema else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
        schemas[_schema_name(rt)] = schema
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.34.1"}, "paths": paths,
            "components": {"schemas": schemas}}
