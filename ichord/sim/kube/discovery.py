"""Discovery documents: /version, /api, /api/v1, /apis, /apis/<group>/<version> (what kubectl reads)."""

from __future__ import annotations

from ichord.sim.kube.resources import BUILTIN_GROUPS, JSON
from ichord.sim.kube.store import Store

VERSION_INFO: JSON = {
    "major": "1", "minor": "34", "gitVersion": "v1.34.1-ichord-sim", "gitCommit": "0" * 40,
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
    "compiler": "gc", "platform": "linux/amd64",
}


def document(store: Store, path: str, server_address: str) -> JSON | None:
    """The discovery body for ``path``, or None when the path is not a discovery path."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return VERSION_INFO
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": _groups(store)}
    if len(parts) == 2 and parts[0] == "api":
        return _resource_list(store, parts[1])
    if len(parts) == 2 and parts[0] == "apis":
        for group in _groups(store):
            if group["name"] == parts[1]:
                return {"kind": "APIGroup", "apiVersion": "v1", **group}
        return None
    if len(parts) == 3 and parts[0] == "apis":
        return _resource_list(store, f"{parts[1]}/{parts[2]}")
    return None


def _groups(store: Store) -> list[JSON]:
    versions: dict[str, list[str]] = {}
    for api_version in store.groups():
        if "/" in api_version:
            group, version = api_version.split("/", 1)
            versions.setdefault(group, []).append(version)
    preferred = dict(BUILTIN_GROUPS)
    out = []
    for group in sorted(versions):
        vers = sorted(versions[group], reverse=True)
        pref = preferred.get(group, vers[0])
        out.append({"name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in vers],
                    "preferredVersion": {"groupVersion": f"{group}/{pref}", "version": pref}})
    return out


def _resource_list(store: Store, api_version: str) -> JSON | None:
    types = store.groups().get(api_version)
    if not types:
        return None
    resources: list[JSON] = []
    for rt in sorted(types, key=lambda t: t.plural):
        resources.extend(rt.discovery())
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources}
