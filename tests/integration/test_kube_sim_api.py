"""The simulator's API semantics, exercised through kubernetes-asyncio's generated APIs over HTTPS."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from ichord.kube import errors
from ichord.kube.client import KubeClient
from ichord.kube.crds import GROUP, VERSION, machines, operations
from ichord.sim.kube import KubeSimulator, SimSettings
from tests.integration._kube_helpers import fast_bookmarks, machine

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"


@pytest.fixture
def sim_settings() -> SimSettings:
    return fast_bookmarks()


async def test_crud_and_typed_errors(kube: KubeClient) -> None:
    core = kube.core()
    created = await core.create_namespaced_config_map(NS, {"metadata": {"name": "a", "labels": {"x": "1"}},
                                                           "data": {"k": "v"}})
    assert created.metadata.uid and created.metadata.resource_version
    got = await core.read_namespaced_config_map("a", NS)
    assert got.data == {"k": "v"}
    with pytest.raises(errors.AlreadyExists) as dup, errors.translate():
        await core.create_namespaced_config_map(NS, {"metadata": {"name": "a"}})
    assert dup.value.status == 409 and dup.value.reason == "AlreadyExists"
    await core.delete_namespaced_config_map("a", NS)
    with pytest.raises(errors.NotFound) as nf, errors.translate():
        await core.read_namespaced_config_map("a", NS)
    assert nf.value.status == 404
    with pytest.raises(errors.NotFound), errors.translate():
        await core.create_namespaced_config_map("nowhere", {"metadata": {"name": "a"}})


async def test_stale_update_conflicts(kube: KubeClient) -> None:
    core = kube.core()
    first = await core.create_namespaced_config_map(NS, {"metadata": {"name": "c"}, "data": {"n": "0"}})
    first.data = {"n": "1"}
    await core.replace_namespaced_config_map("c", NS, first)
    first.data = {"n": "2"}  # still carries the old resourceVersion
    with pytest.raises(errors.Conflict) as conflict, errors.translate():
        await core.replace_namespaced_config_map("c", NS, first)
    assert conflict.value.status == 409 and conflict.value.retryable
    assert (await core.read_namespaced_config_map("c", NS)).data == {"n": "1"}


async def test_delete_preconditions(kube: KubeClient) -> None:
    ms = machines(kube)
    obj = await ms.create(NS, machine("p"))
    with pytest.raises(errors.Conflict):
        await ms.delete(NS, "p", uid="not-the-uid")
    await ms.delete(NS, "p", uid=obj["metadata"]["uid"])
    with pytest.raises(errors.NotFound):
        await ms.get(NS, "p")


async def test_status_subresource_and_generation(kube: KubeClient) -> None:
    ms = machines(kube)
    obj = await ms.create(NS, {**machine("m"), "status": {"nodeName": "ignored-on-create"}})
    assert "status" not in obj and obj["metadata"]["generation"] == 1
    # A status write leaves spec and generation alone.
    obj = await ms.patch_status(NS, "m", {"status": {"nodeName": "n1"}, "spec": {"role": "controlplane"}})
    assert obj["status"] == {"nodeName": "n1"} and obj["spec"]["role"] == "worker"
    assert obj["metadata"]["generation"] == 1
    # A spec write ignores status and bumps generation; a metadata-only write does not.
    obj = await ms.patch(NS, "m", {"spec": {"approved": True}, "status": {"nodeName": "hacked"}})
    assert obj["metadata"]["generation"] == 2 and obj["status"] == {"nodeName": "n1"}
    obj = await ms.patch(NS, "m", {"metadata": {"labels": {"a": "b"}}})
    assert obj["metadata"]["generation"] == 2
    # An update with the read resourceVersion works; the same body again is stale.
    obj["spec"]["address"] = "10.0.0.1"
    newer = await ms.replace(NS, "m", obj)
    assert newer["metadata"]["generation"] == 3
    with pytest.raises(errors.Conflict):
        await ms.replace(NS, "m", obj)


async def test_finalizers_hold_deletion(kube: KubeClient) -> None:
    ops = operations(kube)
    await ops.create(NS, {"metadata": {"name": "op", "finalizers": ["ichor.maesh.dev/ca-rotation"]},
                          "spec": {"clusterRef": {"name": "c1"}, "kind": "ca-rotation"}})
    held = await ops.delete(NS, "op")
    assert held["metadata"]["deletionTimestamp"]
    still = await ops.get(NS, "op")
    assert still["metadata"]["finalizers"] == ["ichor.maesh.dev/ca-rotation"]
    with pytest.raises(errors.Invalid):  # no new finalizer on an object being deleted
        await ops.patch(NS, "op", {"metadata": {"finalizers": ["ichor.maesh.dev/ca-rotation", "other"]}})
    await ops.patch(NS, "op", {"metadata": {"finalizers": None}})
    with pytest.raises(errors.NotFound):
        await ops.get(NS, "op")


async def test_schema_refusals_and_defaults(kube: KubeClient) -> None:
    ms, ops = machines(kube), operations(kube)
    with pytest.raises(errors.Invalid) as bad:
        await ms.create(NS, machine("x", role="x"))
    assert bad.value.status == 422
    assert 'spec.role: Unsupported value: "x": supported values: "controlplane", "worker"' in str(bad.value)
    assert bad.value.causes[0]["field"] == "spec.role"
    with pytest.raises(errors.Invalid) as missing:
        await ms.create(NS, {"metadata": {"name": "y"}, "spec": {"role": "worker"}})
    assert "spec.clusterRef: Required value" in str(missing.value)
    with pytest.raises(errors.Invalid) as typed:
        await ms.create(NS, machine("z", approved="yes"))
    assert "spec.approved" in str(typed.value) and "boolean" in str(typed.value)
    with pytest.raises(errors.Invalid) as dup:
        await ops.create(NS, {"metadata": {"name": "o"}, "spec": {"clusterRef": {"name": "c"}, "kind": "ca-rotation",
                                                                  "caRotation": {"targets": ["talos", "talos"]}}})
    assert "Duplicate value" in str(dup.value)
    # Defaults are applied and unknown fields pruned, like a structural schema does.
    op = await ops.create(NS, {"metadata": {"name": "o"}, "spec": {"clusterRef": {"name": "c"}, "kind": "config",
                                                                   "bogus": 1}})
    assert op["spec"]["paused"] is False and "bogus" not in op["spec"]
    assert "maxUnavailable" not in op["spec"]  # no schema default: absent means the cluster's or the daemon's
    # maxUnavailable is an int-or-string: an int of at least 1 or a percentage in (0%, 100%].
    for good in (3, "25%", "100%"):
        made = await ops.create(NS, {"metadata": {"name": f"mu-{str(good).strip('%')}"}, "spec": {
            "clusterRef": {"name": "c"}, "kind": "config", "maxUnavailable": good}})
        assert made["spec"]["maxUnavailable"] == good
    refusals = {0: "spec.maxUnavailable in body should be greater than or equal to 1",
                "0%": "spec.maxUnavailable in body should match '^(100|[1-9][0-9]?)%$'",
                "4": "spec.maxUnavailable in body should match",
                "101%": "spec.maxUnavailable in body should match",
                True: "spec.maxUnavailable in body must be of type integer,string"}
    for bad_value, expected in refusals.items():
        with pytest.raises(errors.Invalid) as refused:
            await ops.create(NS, {"metadata": {"name": "mu-bad"}, "spec": {
                "clusterRef": {"name": "c"}, "kind": "config", "maxUnavailable": bad_value}})
        assert expected in str(refused.value), (bad_value, str(refused.value))
    with pytest.raises(errors.BadRequest) as strict, errors.translate():  # fieldValidation=Strict refuses, not prunes
        await kube.custom().create_namespaced_custom_object(
            GROUP, VERSION, NS, "talosoperations", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TalosOperation",
                                                    "metadata": {"name": "s"}, "spec": {
                                                        "clusterRef": {"name": "c"}, "kind": "config", "bogus": 1}},
            field_validation="Strict")
    assert 'unknown field "spec.bogus"' in str(strict.value)
    with pytest.raises(errors.Invalid) as only_rotation:  # CEL: caRotation only for kind ca-rotation
        await ops.create(NS, {"metadata": {"name": "cfg"}, "spec": {"clusterRef": {"name": "c"}, "kind": "config",
                                                                    "caRotation": {"targets": ["talos"]}}})
    assert "spec: Invalid value: caRotation is only valid for kind ca-rotation" in str(only_rotation.value)
    with pytest.raises(errors.Invalid) as immutable:  # spec.kind is immutable (x-kubernetes-validations)
        await ops.patch(NS, "o", {"spec": {"kind": "ca-rotation"}})
    assert 'spec.kind: Invalid value: "ca-rotation": kind is immutable' in str(immutable.value)


async def test_patch_types(kube: KubeClient) -> None:
    apps = kube.apps()
    dep = {"metadata": {"name": "d", "annotations": {"keep": "1"}},
           "spec": {"selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}},
                                 "spec": {"containers": [{"name": "a", "image": "a:1"},
                                                         {"name": "b", "image": "b:1"}]}}}}
    await apps.create_namespaced_deployment(NS, dep)
    # Strategic merge: containers merge by name, template annotations are added.
    await apps.patch_namespaced_deployment(
        "d", NS, {"spec": {"template": {"metadata": {"annotations": {"restartedAt": "now"}},
                                        "spec": {"containers": [{"name": "b", "image": "b:2"}]}}}},
        _content_type="application/strategic-merge-patch+json")
    got = await apps.read_namespaced_deployment("d", NS)
    assert [(c.name, c.image) for c in got.spec.template.spec.containers] == [("a", "a:1"), ("b", "b:2")]
    assert got.spec.template.metadata.annotations == {"restartedAt": "now"}
    # Merge patch: a list is replaced, null deletes.
    await apps.patch_namespaced_deployment(
        "d", NS, {"metadata": {"annotations": {"keep": None, "new": "2"}}},
        _content_type="application/merge-patch+json")
    # JSON patch: precise operations, with a failing test op refused.
    await apps.patch_namespaced_deployment(
        "d", NS, [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "a:3"}],
        _content_type="application/json-patch+json")
    got = await apps.read_namespaced_deployment("d", NS)
    assert got.metadata.annotations == {"new": "2"}
    assert got.spec.template.spec.containers[0].image == "a:3"
    with pytest.raises(errors.Invalid), errors.translate():
        await apps.patch_namespaced_deployment("d", NS, [{"op": "test", "path": "/metadata/name", "value": "no"}],
                                               _content_type="application/json-patch+json")
    # Custom resources do not take strategic merge (415), like the real server.
    await machines(kube).create(NS, machine("sm"))
    with pytest.raises(errors.KubeError) as unsupported, errors.translate():
        await kube.custom().patch_namespaced_custom_object(
            GROUP, VERSION, NS, "talosmachines", "sm", {"spec": {"approved": True}},
            _content_type="application/strategic-merge-patch+json")
    assert unsupported.value.status == 415


async def test_label_and_field_selectors(kube: KubeClient) -> None:
    core = kube.core()
    for name, labels in (("p1", {"app": "x", "tier": "a"}), ("p2", {"app": "x", "tier": "b"}), ("p3", {"app": "y"})):
        await core.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": labels},
                                              "spec": {"nodeName": "n1" if name != "p3" else "n2",
                                                       "containers": [{"name": "c", "image": "i"}]}})

    async def names(**kw: Any) -> list[str]:
        return sorted(p.metadata.name for p in (await core.list_namespaced_pod(NS, **kw)).items)
    assert await names(label_selector="app=x") == ["p1", "p2"]
    assert await names(label_selector="app=x,tier!=a") == ["p2"]
    assert await names(label_selector="tier in (a,b)") == ["p1", "p2"]
    assert await names(label_selector="!tier") == ["p3"]
    assert await names(field_selector="spec.nodeName=n2") == ["p3"]
    assert await names(field_selector="metadata.name=p1") == ["p1"]
    with pytest.raises(errors.BadRequest), errors.translate():
        await names(field_selector="spec.bogus=1")
    await core.create_namespaced_event(NS, {"metadata": {"name": "e1"}, "reason": "R", "type": "Normal",
                                            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": NS}})
    evs = await core.list_namespaced_event(NS, field_selector="involvedObject.name=p1,involvedObject.kind=Pod")
    assert [e.metadata.name for e in evs.items] == ["e1"]


async def _read_events(resp: Any, count: int) -> list[dict[str, Any]]:
    out = []
    while len(out) < count:
        line = await resp.content.readline()
        if not line:
            break
        out.append(json.loads(line))
    return out


async def test_watch_bookmarks_and_gone(sim: KubeSimulator, kube: KubeClient) -> None:
    core = kube.core()
    listed = await core.list_namespaced_config_map(NS)
    rv = listed.metadata.resource_version
    resp = await core.list_namespaced_config_map(NS, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                                 timeout_seconds=5, _preload_content=False)
    try:
        await core.create_namespaced_config_map(NS, {"metadata": {"name": "w"}})
        await core.patch_namespaced_config_map("w", NS, {"data": {"a": "b"}},
                                               _content_type="application/merge-patch+json")
        await core.delete_namespaced_config_map("w", NS)
        events = await _read_events(resp, 4)
    finally:
        resp.release()
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    assert int(events[3]["object"]["metadata"]["resourceVersion"]) >= int(
        events[2]["object"]["metadata"]["resourceVersion"])
    # History older than the retained window: the watch answers 200 and an in-stream 410 ERROR.
    sim.compact()
    resp = await core.list_namespaced_config_map(NS, watch=True, resource_version=rv, _preload_content=False)
    try:
        (error,) = await _read_events(resp, 1)
    finally:
        resp.release()
    assert error["type"] == "ERROR" and error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"


async def test_watch_server_timeout_ends_stream(kube: KubeClient) -> None:
    resp = await kube.core().list_namespaced_config_map(NS, watch=True, timeout_seconds=0.2, _preload_content=False)
    try:
        events = await _read_events(resp, 100)  # ends when the server closes the stream
    finally:
        resp.release()
    assert [e["type"] for e in events] == ["ADDED"]  # the synthetic ADDED of kube-root-ca.crt, then the end


async def test_eviction_honours_pdb(kube: KubeClient) -> None:
    core, policy = kube.core(), kube.policy()
    for i in range(2):
        await core.create_namespaced_pod(NS, {"metadata": {"name": f"e{i}", "labels": {"app": "e"}},
                                              "spec": {"containers": [{"name": "c", "image": "i"}]},
                                              "status": {"phase": "Running",
                                                         "conditions": [{"type": "Ready", "status": "True"}]}})
    await policy.create_namespaced_pod_disruption_budget(NS, {"metadata": {"name": "pdb"}, "spec": {
        "minAvailable": 1, "selector": {"matchLabels": {"app": "e"}}}})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e0", "namespace": NS}}
    await core.create_namespaced_pod_eviction("e0", NS, eviction)
    with pytest.raises(errors.TooManyRequests) as refused, errors.translate():
        await core.create_namespaced_pod_eviction("e1", NS, {**eviction, "metadata": {"name": "e1", "namespace": NS}})
    assert refused.value.status == 429 and "disruption budget" in str(refused.value)
    remaining = await core.list_namespaced_pod(NS)
    assert [p.metadata.name for p in remaining.items] == ["e1"]


async def test_discovery_and_crd_registration(kube: KubeClient) -> None:
    groups = await k8s.ApisApi(kube.api).get_api_versions()
    names = {g.name for g in groups.groups}
    assert {"ichor.maesh.dev", "apps", "coordination.k8s.io", "policy", "apiextensions.k8s.io"} <= names
    resources = await k8s.CustomObjectsApi(kube.api).get_api_resources(GROUP, VERSION)
    assert {r.name for r in resources.resources} >= {"talosclusters", "talosmachines/status"}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}}
    await k8s.ApiextensionsV1Api(kube.api).create_custom_resource_definition(crd)
    created = await kube.custom().create_namespaced_custom_object(
        "example.com", "v1", NS, "widgets", {"apiVersion": "example.com/v1", "kind": "Widget",
                                             "metadata": {"name": "w"}, "spec": {"size": 3}})
    assert created["spec"] == {"size": 3}
    await k8s.ApiextensionsV1Api(kube.api).delete_custom_resource_definition("widgets.example.com")
    with pytest.raises(errors.NotFound), errors.translate():  # a deleted CRD no longer serves its kind
        await kube.custom().get_namespaced_custom_object("example.com", "v1", NS, "widgets", "w")
