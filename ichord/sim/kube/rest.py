"""REST handlers: CRUD, patch, delete, watch streams and eviction, on top of the Store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.sim.kube import paging, protobuf, selectors, tables
from ichord.sim.kube.eviction import evict
from ichord.sim.kube.fieldvalidation import FieldValidation
from ichord.sim.kube.patch import APPLY_PATCH
from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.routes import Route
from ichord.sim.kube.status import ApiError, bad_request, method_not_allowed
from ichord.sim.kube.store import Store


@dataclass
class WatchSettings:
    #: How often an idle watch gets a BOOKMARK (the real server: about a minute).
    bookmark_interval: float = 1.0
    #: Server-side timeout when the client sends no timeoutSeconds (real: 30-60 min, randomised).
    default_timeout: float = 1800.0


def json_response(body: JSON, status: int = 200, validation: FieldValidation | None = None) -> web.Response:
    resp = web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")
    for name, value in validation.headers() if validation is not None else ():
        resp.headers.add(name, value)
    return resp


class Rest:
    def __init__(self, store: Store, watch: WatchSettings) -> None:
        self.store = store
        self.watch_settings = watch
        self.open_watches: set[Any] = set()

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        rt = self.store.resolve(route.group, route.version, route.plural)
        if route.subresource and route.subresource not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if route.namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        if route.verb == "watch":
            return await self._watch(request, rt, route)
        if route.verb == "list":
            pred = self._predicate(rt, q)
            items, rv = self.store.list(rt, route.namespace, pred)
            if tables.wants_table(request.headers.get("Accept", "")):
                return json_response(tables.table(rt, items, rv, self.store.clock(), q.get("includeObject")))
            return json_response({"kind": rt.list_kind, "apiVersion": rt.api_version,
                                  "metadata": paging.page_metadata(rv, items, q), "items": paging.page(items, q)})
        if route.verb == "get":
            obj = self.store.get(rt, route.namespace, route.name or "")
            if tables.wants_table(request.headers.get("Accept", "")):
                return json_response(tables.table(rt, [obj], self.store.rv, self.store.clock(),
                                                  q.get("includeObject")))
            return json_response(obj)
        if q.get("dryRun"):
            # Refused rather than silently persisted: the simulator has no dry-run path.
            raise bad_request("dryRun is not supported by the ichord simulator")
        body = await self._body(request)
        fv = FieldValidation.of(q.get("fieldValidation"), route.verb)
        if route.verb == "create":
            if route.subresource == "eviction":
                return json_response(evict(self.store, route.namespace or "", route.name or "", body), 201)
            if route.name is not None:
                raise method_not_allowed("POST is not allowed on a named object")
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be an object")
            ns = (body.get("metadata") or {}).get("namespace")
            if rt.namespaced and ns and route.namespace and ns != route.namespace:
                raise bad_request("the namespace of the provided object does not match the namespace sent on "
                                  "the request")
            return json_response(self.store.create(rt, route.namespace, body, validation=fv), 201, fv)
        if route.verb == "update":
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be an object")
            return json_response(self.store.update(rt, route.namespace, route.name or "", body, route.subresource,
                                                   validation=fv), 200, fv)
        if route.verb == "patch":
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            if ctype == APPLY_PATCH:
                obj, created = self.store.server_side_apply(rt, route.namespace, route.name or "", body,
                                                            q.get("fieldManager"), q.get("force") == "true",
                                                            route.subresource, validation=fv)
                return json_response(obj, 201 if created else 200, fv)
            return json_response(self.store.patch(rt, route.namespace, route.name or "", ctype, body,
                                                  route.subresource, validation=fv), 200, fv)
        if route.verb == "delete":
            pre = body.get("preconditions") if isinstance(body, dict) else None
            obj, gone_now = self.store.delete(rt, route.namespace, route.name or "", pre)
            if rt.returns_deleted_object or not gone_now:
                return json_response(obj)
            return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "details": {"name": route.name, "group": rt.group, "kind": rt.plural,
                                              "uid": obj["metadata"]["uid"]}})
        if route.verb == "deletecollection":
            items, _rv = self.store.list(rt, route.namespace, self._predicate(rt, q))
            for item in items:
                with contextlib.suppress(ApiError):
                    self.store.delete(rt, item["metadata"].get("namespace"), item["metadata"]["name"])
            return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        raise method_not_allowed(f"{request.method} is not supported on {rt.qualified}")

    @staticmethod
    def _predicate(rt: ResourceType, q: Any) -> Any:
        labels = selectors.label_selector(q.get("labelSelector"))
        fields = selectors.field_selector(q.get("fieldSelector"), rt.plural)
        return lambda o: labels(o) and fields(o)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        ctype = request.headers.get("Content-Type", "")
        if protobuf.is_protobuf(ctype):
            return protobuf.decode(raw)
        if ctype.split(";")[0].strip() == APPLY_PATCH:  # YAML (JSON is YAML too)
            try:
                return json.loads(json.dumps(yamlio.load(raw.decode())))
            except (ValueError, UnicodeDecodeError, YAMLError) as exc:
                raise bad_request(f"error decoding YAML: {exc}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise bad_request("the request body is not valid JSON") from None

    async def _watch(self, request: web.Request, rt: ResourceType, route: Route) -> web.StreamResponse:
        q = request.query
        pred = self._predicate(rt, q)
        bookmarks = q.get("allowWatchBookmarks", "").lower() in ("1", "true")
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        try:
            timeout = float(q["timeoutSeconds"]) if "timeoutSeconds" in q else (
                self.watch_settings.default_timeout * (1 + random.random()))  # noqa: S311
        except ValueError:
            raise bad_request("timeoutSeconds must be a number") from None
        # WatchList (KEP-3157, on by default in client-go 1.32+: kubectl wait/get -w): the current state as ADDED
        # events, then a BOOKMARK annotated k8s.io/initial-events-end, then the changes, like kube-apiserver.
        initial = q.get("sendInitialEvents", "").lower() in ("1", "true")
        if initial and (q.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks):
            raise bad_request("sendInitialEvents requires resourceVersionMatch=NotOlderThan and "
                              "allowWatchBookmarks=true")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            watcher = self.store.watch(rt, route.namespace, None if initial else q.get("resourceVersion"), pred)
        except ApiError as err:
            await resp.write(_line({"type": "ERROR", "object": err.status()}))
            await resp.write_eof()
            return resp
        if initial:  # synchronous with the watch's start: no change can slip between the state and the bookmark
            end = self._bookmark(rt)["object"]
            end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
            watcher.queue.put_nowait(("BOOKMARK", end))
        self.open_watches.add(watcher)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.watch_settings.bookmark_interval
        dropped = asyncio.ensure_future(watcher.dropped.wait())
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    if bookmarks and not watcher.stalled and watcher.queue.empty():
                        await resp.write(_line(self._bookmark(rt)))
                    await resp.write_eof()
                    return resp
                get = asyncio.ensure_future(watcher.queue.get())
                done, _ = await asyncio.wait({get, dropped}, timeout=min(deadline, next_bookmark) - now,
                                             return_when=asyncio.FIRST_COMPLETED)
                if dropped in done:
                    get.cancel()
                    if request.transport is not None:
                        request.transport.close()  # abrupt: no terminating chunk
                    return resp
                try:
                    if get in done:
                        kind, obj = get.result()
                        if as_table and kind != "BOOKMARK":
                            obj = tables.table(rt, [obj], int(obj["metadata"]["resourceVersion"]),
                                               self.store.clock(), q.get("includeObject"))
                        await resp.write(_line({"type": kind, "object": obj}))
                        continue
                    get.cancel()
                    if loop.time() >= next_bookmark:
                        next_bookmark = loop.time() + self.watch_settings.bookmark_interval
                        if bookmarks and not watcher.stalled and watcher.queue.empty():
                            await resp.write(_line(self._bookmark(rt)))
                except ConnectionResetError:
                    return resp  # the client went away: the watch simply ends, as on a real server
        finally:
            dropped.cancel()
            self.store.log.unsubscribe(watcher)
            self.open_watches.discard(watcher)

    def _bookmark(self, rt: ResourceType) -> JSON:
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                               "metadata": {"resourceVersion": str(self.store.rv)}}}


def _line(event: JSON) -> bytes:
    return json.dumps(event).encode() + b"\n"
