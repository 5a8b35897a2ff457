"""Typed access to ichord's three custom resources through the custom objects API.

Patches name their content type explicitly: kubernetes-asyncio sends a dict as json-patch otherwise.
"""

from __future__ import annotations

import enum
from typing import Any
from urllib.parse import quote

from ichord.api.names import API_VERSION, GROUP, PLURALS, TALOS_CLUSTER, TALOS_MACHINE, TALOS_OPERATION, VERSION
from ichord.kube.client import KubeClient
from ichord.kube.errors import translate

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Obj = dict[str, Any]


class Kind(enum.Enum):
    """(kind, plural) of each custom resource."""

    TALOS_CLUSTER = (TALOS_CLUSTER, PLURALS[TALOS_CLUSTER])
    TALOS_MACHINE = (TALOS_MACHINE, PLURALS[TALOS_MACHINE])
    TALOS_OPERATION = (TALOS_OPERATION, PLURALS[TALOS_OPERATION])

    @property
    def kind(self) -> str:
        return self.value[0]

    @property
    def plural(self) -> str:
        return self.value[1]


class CustomObjects:
    """CRUD for one kind; objects are plain dicts as the API returns them (uncached).

    Every write tells the client's ``on_written`` observers the object it returned."""

    def __init__(self, client: KubeClient, kind: Kind) -> None:
        self._client = client
        self._api = client.custom()
        self.kind = kind

    def _wrote(self, obj: Obj) -> Obj:
        if isinstance(obj, dict) and obj.get("kind") == self.kind.kind:  # a delete may answer with a Status
            self._client.wrote(self.kind.plural, obj)
        return obj

    async def get(self, namespace: str, name: str) -> Obj:
        with translate():
            obj: Obj = await self._api.get_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural, name)
        return obj

    async def list_objects(self, namespace: str | None = None, *,
                           label_selector: str | None = None) -> tuple[list[Obj], str]:
        """Items and the list's resourceVersion; all namespaces when ``namespace`` is None."""
        kwargs: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        with translate():
            if namespace is None:
                out = await self._api.list_cluster_custom_object(GROUP, VERSION, self.kind.plural, **kwargs)
            else:
                out = await self._api.list_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural,
                                                                    **kwargs)
        return list(out.get("items") or []), str((out.get("metadata") or {}).get("resourceVersion", ""))

    async def create(self, namespace: str, body: Obj) -> Obj:
        body = {"apiVersion": API_VERSION, "kind": self.kind.kind, **body}
        with translate():
            obj: Obj = await self._api.create_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural,
                                                                        body)
        return self._wrote(obj)

    async def replace(self, namespace: str, name: str, body: Obj) -> Obj:
        """PUT with the body's resourceVersion: a stale one raises Conflict."""
        with translate():
            obj: Obj = await self._api.replace_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural,
                                                                         name, body)
        return self._wrote(obj)

    async def patch(self, namespace: str, name: str, patch: Obj | list[Obj]) -> Obj:
        """Merge-patch a dict, json-patch a list of operations (spec and metadata; status is ignored)."""
        ctype = JSON_PATCH if isinstance(patch, list) else MERGE_PATCH
        with translate():
            obj: Obj = await self._api.patch_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural,
                                                                       name, patch, _content_type=ctype)  # type: ignore[call-arg]
        return self._wrote(obj)

    async def patch_status(self, namespace: str, name: str, patch: Obj | list[Obj]) -> Obj:
        """By path, the body as JSON: every machine's status write of a converging fleet comes here, and the
        generated client's sanitising and deserialising was about a quarter of each one's cost (py-spy)."""
        ctype = JSON_PATCH if isinstance(patch, list) else MERGE_PATCH
        path = (f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{self.kind.plural}/"
                f"{quote(name, safe='')}/status")
        obj: Obj = await self._client.raw("PATCH", path, body=patch, content_type=ctype)
        return self._wrote(obj)

    async def delete(self, namespace: str, name: str, *, uid: str | None = None,
                     resource_version: str | None = None) -> Obj:
        """Delete, optionally only if the object is still the one with ``uid``/``resource_version``."""
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre} if pre else None
        with translate():
            obj: Obj = await self._api.delete_namespaced_custom_object(GROUP, VERSION, namespace, self.kind.plural,
                                                                        name, body=body)  # type: ignore[arg-type]
        return self._wrote(obj)


def clusters(client: KubeClient) -> CustomObjects:
    return CustomObjects(client, Kind.TALOS_CLUSTER)


def machines(client: KubeClient) -> CustomObjects:
    return CustomObjects(client, Kind.TALOS_MACHINE)


def operations(client: KubeClient) -> CustomObjects:
    return CustomObjects(client, Kind.TALOS_OPERATION)
