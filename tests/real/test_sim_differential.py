"""Differential conformance: the same requests to the Kubernetes API simulator and to the real
kube-apiserver, the answers normalised (status code, Status reason and message, the fields a client
reads) and compared. Each scenario runs on both in a namespace of its own; a difference fails the
scenario and shows both sides. Where the simulator differed it was fixed (see the module's git log);
the few deliberate differences are named in ``NORMALISED`` with the reason.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.sim.kube import KubeSimulator
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane
from tests.real.wire import Answer, Wire

pytestmark = [pytest.mark.anyio]

GROUP_PATH = "/apis/ichor.maesh.dev/v1alpha1"
ROOT_CA = "kube-root-ca.crt"
_SEQ = itertools.count()

#: What is normalised away, and why: values each server chooses for itself.
NORMALISED = (
    "uid, resourceVersion, creationTimestamp, managedFields: server-assigned",
    "deletionTimestamp: its value (only its presence is compared)",
    "kube-root-ca.crt in a new namespace: the simulator plays kube-controller-manager, which publishes it; the "
    "real tier runs no controller-manager",
)

Observed = list[Any]
Scenario = Callable[[Wire, str, "Side"], Awaitable[Observed]]


class Side:
    """The server under test beyond its wire: its kubeconfig (for kubectl), and the simulator itself (a
    scenario may compact its history to make a watch too old, which the real server does on its own)."""

    def __init__(self, kubeconfig: Path, sim: KubeSimulator | None = None, plane: ControlPlane | None = None) -> None:
        self.kubeconfig, self.sim, self.plane = kubeconfig, sim, plane

    def compact(self) -> None:
        """Forget the history before now (kube-apiserver: etcd compaction; the simulator: its event window)."""
        if self.sim is not None:
            self.sim.compact()
        if self.plane is not None:
            self.plane.compact_etcd()


def err(a: Answer) -> tuple[Any, ...]:
    details = a.field("details") or {}
    return (a.code, a.reason, a.field("message"), details.get("kind"), details.get("name"))


def cm(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **extra.pop("meta", {})}, **extra}


def machine(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine", "metadata": {"name": name},
            "spec": {"clusterRef": {"name": "c1"}, "role": "worker", **spec}}


# ---- scenarios ------------------------------------------------------------------------------


async def crud_and_conflicts(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = await w.call("POST", base, cm("a", data={"k": "v"}))
    dup = await w.call("POST", base, cm("a"))
    missing = await w.call("GET", f"{base}/nope")
    obj = created.body
    obj["data"] = {"k": "2"}
    updated = await w.call("PUT", f"{base}/a", obj)
    obj["data"] = {"k": "3"}  # still the first resourceVersion
    stale = await w.call("PUT", f"{base}/a", obj)
    renamed = await w.call("PUT", f"{base}/a", cm("b"))
    no_ns = await w.call("POST", "/api/v1/namespaces/nowhere-at-all/configmaps", cm("a"))
    deleted = await w.call("DELETE", f"{base}/a")
    gone = await w.call("GET", f"{base}/a")
    return [created.code, err(dup), err(missing), (updated.code, updated.field("data")), err(stale),
            err(renamed)[:2], err(no_ns), (deleted.code, deleted.field("kind")), err(gone)]


async def patches(w: Wire, ns: str, _side: Side) -> Observed:
    path = f"/api/v1/namespaces/{ns}/configmaps/p"
    await w.call("POST", f"/api/v1/namespaces/{ns}/configmaps", cm("p", data={"a": "1", "b": "2"},
                                                                  meta={"labels": {"x": "1"}}))
    merge = await w.call("PATCH", path, {"metadata": {"labels": {"y": "2", "x": None}}, "data": {"b": None}},
                         content_type="application/merge-patch+json")
    jsonp = await w.call("PATCH", path, [{"op": "add", "path": "/metadata/annotations", "value": {"n": "1"}},
                                         {"op": "replace", "path": "/data/a", "value": "9"}],
                         content_type="application/json-patch+json")
    failed_test = await w.call("PATCH", path, [{"op": "test", "path": "/data/a", "value": "0"}],
                               content_type="application/json-patch+json")
    bad_path = await w.call("PATCH", path, [{"op": "replace", "path": "/data/zzz", "value": "0"}],
                            content_type="application/json-patch+json")
    removed = await w.call("PATCH", path, [{"op": "remove", "path": "/data/absent"}],
                           content_type="application/json-patch+json")
    strategic = await w.call("PATCH", path, {"metadata": {"labels": {"z": "3"}}},
                             content_type="application/strategic-merge-patch+json")
    missing = await w.call("PATCH", f"/api/v1/namespaces/{ns}/configmaps/none", {"data": {}},
                           content_type="application/merge-patch+json")
    return [(merge.code, merge.field("metadata", "labels"), merge.field("data")),
            (jsonp.code, jsonp.field("metadata", "annotations"), jsonp.field("data")),
            err(failed_test), (bad_path.code, bad_path.reason, bad_path.field("data")),
            (removed.code, removed.field("data")), (strategic.code, strategic.field("metadata", "labels")),
            err(missing)]


def _deployment(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": containers}}}}


async def strategic_merge_by_name(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/apis/apps/v1/namespaces/{ns}/deployments"
    created = await w.call("POST", base, _deployment("d", [{"name": "a", "image": "a:1"},
                                                           {"name": "b", "image": "b:1"}]))
    patched = await w.call("PATCH", f"{base}/d", {"spec": {"template": {
        "metadata": {"annotations": {"restartedAt": "now"}},
        "spec": {"containers": [{"name": "b", "image": "b:2"}]}}}},
        content_type="application/strategic-merge-patch+json")
    template = patched.field("spec", "template") or {}
    return [created.code, patched.code, [(c["name"], c["image"]) for c in template["spec"]["containers"]],
            template["metadata"].get("annotations"), patched.field("metadata", "generation")]


async def server_side_apply(w: Wire, ns: str, _side: Side) -> Observed:
    path = f"/api/v1/namespaces/{ns}/configmaps/s"
    body = json.dumps(cm("s", data={"a": "1"})).encode()
    first = await w.call("PATCH", path, body, content_type="application/apply-patch+yaml",
                         params={"fieldManager": "one"})
    again = await w.call("PATCH", path, json.dumps(cm("s", data={"a": "1", "b": "2"})).encode(),
                         content_type="application/apply-patch+yaml", params={"fieldManager": "one"})
    clash = await w.call("PATCH", path, json.dumps(cm("s", data={"a": "other"})).encode(),
                         content_type="application/apply-patch+yaml", params={"fieldManager": "two"})
    forced = await w.call("PATCH", path, json.dumps(cm("s", data={"a": "other"})).encode(),
                          content_type="application/apply-patch+yaml", params={"fieldManager": "two", "force": "true"})
    # "one" now owns only b; applying without it removes b and leaves a (owned by "two").
    dropped = await w.call("PATCH", path, b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s\n",
                           content_type="application/apply-patch+yaml", params={"fieldManager": "one"})
    no_manager = await w.call("PATCH", path, json.dumps(cm("s")).encode(), content_type="application/apply-patch+yaml")
    return [(first.code, first.field("data")), (again.code, again.field("data")), err(clash)[:3],
            clash.field("details", "causes"), (forced.code, forced.field("data")),
            (dropped.code, dropped.field("data")), err(no_manager)[:3]]


async def status_subresource(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"{GROUP_PATH}/namespaces/{ns}/talosmachines"
    body = machine("m")
    body["status"] = {"nodeName": "ignored"}
    created = await w.call("POST", base, body)
    gen0 = created.field("metadata", "generation")
    st = await w.call("PATCH", f"{base}/m/status", {"status": {"nodeName": "n1"}, "spec": {"role": "controlplane"}},
                      content_type="application/merge-patch+json")
    spec = await w.call("PATCH", f"{base}/m", {"spec": {"hostname": "h"}, "status": {"nodeName": "no"}},
                        content_type="application/merge-patch+json")
    meta = await w.call("PATCH", f"{base}/m", {"metadata": {"labels": {"l": "1"}}},
                        content_type="application/merge-patch+json")
    return [created.code, created.field("status"), gen0,
            (st.code, st.field("status", "nodeName"), st.field("spec", "role"), st.field("metadata", "generation")),
            (spec.code, spec.field("status", "nodeName"), spec.field("spec", "hostname"),
             spec.field("metadata", "generation")),
            (meta.code, meta.field("metadata", "generation"))]


async def finalizers_and_preconditions(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = await w.call("POST", base, cm("f", meta={"finalizers": ["example.com/hold"]}))
    wrong_uid = await w.call("DELETE", f"{base}/f", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                     "preconditions": {"uid": "not-the-uid"}})
    wrong_rv = await w.call("DELETE", f"{base}/f", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                    "preconditions": {"resourceVersion": "1"}})
    deleting = await w.call("DELETE", f"{base}/f", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                    "preconditions": {"uid": created.field("metadata", "uid")}})
    held = await w.call("GET", f"{base}/f")
    again = await w.call("DELETE", f"{base}/f")
    released = await w.call("PATCH", f"{base}/f", {"metadata": {"finalizers": None}},
                            content_type="application/merge-patch+json")
    gone = await w.call("GET", f"{base}/f")
    return [created.code, err(wrong_uid)[:2], err(wrong_rv)[:2],
            (deleting.code, deleting.field("kind"), deleting.field("metadata", "deletionTimestamp") is not None),
            (held.code, held.field("metadata", "finalizers")), (again.code, again.field("kind")),
            released.code, err(gone)[:2]]


async def selectors(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    for name, tier in (("l1", "a"), ("l2", "b"), ("l3", "a")):
        await w.call("POST", base, cm(name, meta={"labels": {"tier": tier}}))

    async def names(**params: str) -> Any:
        a = await w.call("GET", base, params=params)
        if a.code != 200:
            return a.code, a.reason
        shown = sorted(i["metadata"]["name"] for i in a.field("items") or [] if i["metadata"]["name"] != ROOT_CA)
        return a.code, shown, a.field("metadata", "remainingItemCount"), bool(a.field("metadata", "continue"))

    async def next_page() -> Any:
        first = await w.call("GET", base, params={"labelSelector": "tier", "limit": "2"})
        rest = await w.call("GET", base, params={"labelSelector": "tier", "limit": "2",
                                                 "continue": first.field("metadata", "continue") or ""})
        bogus = await w.call("GET", base, params={"limit": "2", "continue": "not-a-token"})
        return ([i["metadata"]["name"] for i in rest.field("items") or []], rest.field("metadata", "continue"),
                (bogus.code, bogus.reason))

    return [await names(labelSelector="tier=a"), await names(labelSelector="tier!=a"),
            await names(labelSelector="tier in (b)"), await names(labelSelector="!tier"),
            await names(fieldSelector="metadata.name=l2"), await names(fieldSelector="metadata.name!=l2"),
            await names(fieldSelector="data.k=v"), await names(labelSelector="tier=a", limit="1"),
            await names(labelSelector="tier", limit="2"), await next_page()]


async def watch_events(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    rv = (await w.call("GET", base)).field("metadata", "resourceVersion")
    created = await w.call("POST", base, cm("w", data={"a": "1"}))
    await w.call("PATCH", f"{base}/w", {"data": {"a": "2"}}, content_type="application/merge-patch+json")
    await w.call("DELETE", f"{base}/w")
    code, events = await w.watch(base, {"resourceVersion": rv}, until=3)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    return [created.code, code, [(e["type"], e["object"]["metadata"]["name"], (e["object"].get("data") or {}).get("a"))
                                 for e in events], rvs == sorted(rvs)]


async def initial_events_end_bookmark(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    for name in ("i1", "i2"):
        await w.call("POST", base, cm(name, meta={"labels": {"set": "i"}}))
    code, events = await w.watch(base, {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                                        "allowWatchBookmarks": "true", "labelSelector": "set=i"}, until=3)
    shown = [(e["type"], e["object"]["metadata"].get("name"),
              (e["object"]["metadata"].get("annotations") or {}).get("k8s.io/initial-events-end")) for e in events]
    return [code, sorted(shown[:2]), shown[2:]]


async def expired_watch(w: Wire, ns: str, side: Side) -> Observed:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    old = (await w.call("POST", base, cm("x0"))).field("metadata", "resourceVersion")
    # etcd keeps the compaction revision itself: two writes put ``old`` + 1 behind it.
    await w.call("POST", base, cm("x1"))
    await w.call("POST", base, cm("x2"))
    side.compact()
    await w.call("POST", base, cm("x3"))
    code, events = await w.watch(base, {"resourceVersion": old}, until=1)
    first = events[0] if events else {}
    status = first.get("object") or {}
    return [code, first.get("type"), status.get("code"), status.get("reason")]


async def validation_errors(w: Wire, ns: str, _side: Side) -> Observed:
    base = f"{GROUP_PATH}/namespaces/{ns}/talosmachines"
    strict = await w.call("POST", base, {**machine("v"), "bogus": 1}, params={"fieldValidation": "Strict"})
    enum = await w.call("POST", base, machine("v", role="boss"))
    required = await w.call("POST", base, {"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                                           "metadata": {"name": "v"}, "spec": {"role": "worker"}})
    typed = await w.call("POST", base, machine("v", approved="yes"))
    await w.call("POST", base, machine("v"))
    cel = await w.call("PATCH", f"{base}/v", {"spec": {"clusterRef": {"name": "c2"}}},
                       content_type="application/merge-patch+json")

    def invalid(a: Answer) -> tuple[Any, ...]:
        causes = sorted((c.get("field"), c.get("reason")) for c in (a.field("details", "causes") or []))
        return (a.code, a.reason, a.field("details", "kind"), a.field("details", "name"), causes)

    return [(strict.code, strict.reason, strict.field("message")), invalid(enum), invalid(required), invalid(typed),
            invalid(cel), cel.field("message")]


def cluster(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster", "metadata": {"name": name},
            "spec": {"secretsRef": {"name": "b"}, "endpoint": "https://10.5.0.2:6443", "kubernetesVersion": "1.34.1",
                     **spec}}


def _patch_refusal(a: Answer) -> tuple[Any, ...]:
    """A strict refusal of a patch, the patched object it shows (server-assigned fields, managedFields) left out."""
    def cut(message: Any) -> Any:
        if not isinstance(message, str) or "Invalid value: " not in message:
            return message
        head, _, rest = message.partition("Invalid value: ")
        return head + "Invalid value: <the patched object>" + rest[rest.rfind('": ') + 1:]
    causes = [{**c, "message": cut(c.get("message"))} for c in a.field("details", "causes") or []]
    return (a.code, a.reason, cut(a.field("message")), causes, sorted(a.field("details") or {}))


async def field_validation(w: Wire, ns: str, side: Side) -> Observed:
    """fieldValidation on a custom resource: Warn (the default) drops an unknown field and names it in a Warning
    header, Ignore drops it in silence, Strict refuses (a create or update 400, a patch 422); server-side apply
    refuses one whatever the directive; a directive that is none of the three is refused naming the options."""
    base = f"{GROUP_PATH}/namespaces/{ns}/talosclusters"
    merge = "application/merge-patch+json"
    warned = await w.call("POST", base, {**cluster("fv", x=1), "top": 2, "metadata": {"name": "fv", "extra": 1}})
    ignored = await w.call("POST", base, cluster("fi", x=1), params={"fieldValidation": "Ignore"})
    refused = await w.call("POST", base, cluster("fs", x=1), params={"fieldValidation": "Strict"})
    patched = await w.call("PATCH", f"{base}/fv", {"spec": {"x": 1, "maintenance": {"y": 2}}}, content_type=merge)
    json_warned = await w.call("PATCH", f"{base}/fv", [{"op": "add", "path": "/spec/z", "value": 1}],
                               content_type="application/json-patch+json")
    strict_merge = await w.call("PATCH", f"{base}/fv", {"spec": {"x": 1}}, content_type=merge,
                                params={"fieldValidation": "Strict"})
    strict_json = await w.call("PATCH", f"{base}/fv", [{"op": "add", "path": "/spec/z", "value": 1}],
                               content_type="application/json-patch+json", params={"fieldValidation": "Strict"})
    status = await w.call("PATCH", f"{base}/fv/status", {"status": {"nope": 1}}, content_type=merge)
    current = (await w.call("GET", f"{base}/fv")).body
    current["spec"]["q"] = 1
    put_warned = await w.call("PUT", f"{base}/fv", current)
    put_refused = await w.call("PUT", f"{base}/fv", current, params={"fieldValidation": "Strict"})
    applied = [await w.call("PATCH", f"{base}/{name}", json.dumps(cluster(name, z=1)).encode(),
                            content_type="application/apply-patch+yaml",
                            params={"fieldManager": "m", **({"fieldValidation": d} if d else {})})
               for name, d in (("fv", ""), ("fv", "Ignore"), ("new", "Strict"))]
    bogus = await w.call("PATCH", f"{base}/fv", {"spec": {}}, content_type=merge, params={"fieldValidation": "warn"})
    final = await w.call("GET", f"{base}/fv")
    kubectl = await anyio.to_thread.run_sync(functools.partial(
        run_kubectl, side.kubeconfig, "-n", ns, "patch", "taloscluster", "fv", "--type", "merge",
        "-p", '{"spec":{"fromKubectl":1}}', check=False))
    return [(warned.code, warned.warnings, warned.field("metadata", "name")), (ignored.code, ignored.warnings),
            err(refused), (patched.code, patched.warnings, patched.field("spec", "maintenance")),
            (json_warned.code, json_warned.warnings), _patch_refusal(strict_merge), _patch_refusal(strict_json),
            (status.code, status.warnings), (put_warned.code, put_warned.warnings), err(put_refused),
            [(a.code, a.reason, a.field("message"), a.warnings) for a in applied], err(bogus)[:3],
            bogus.field("details"), sorted(set(final.field("spec")) & {"x", "y", "z", "q", "top", "fromKubectl"}),
            "extra" in final.field("metadata"), [line for line in kubectl.splitlines() if "Warning" in line]]


async def list_map_keys_and_bounds(w: Wire, ns: str, _side: Side) -> Observed:
    """The TalosCluster's maintenance windows are a list-type map keyed by name (a second window of one name is
    refused), a window lasts at most 7 days (CEL rules: a recurring one's duration, a one-off one's start to end), and
    an etcd snapshot retention is at most 1000."""
    base = f"{GROUP_PATH}/namespaces/{ns}/talosclusters"
    weekly = {"name": "w", "schedule": "0 22 * * SAT", "duration": "4h"}
    one_off = {"name": "w", "start": "2026-12-24T20:00:00Z", "end": "2026-12-24T23:00:00Z"}
    answers = [await w.call("POST", base, cluster(f"lm-{i}", **spec)) for i, spec in enumerate((
        {"maintenance": {"windows": [weekly, dict(weekly)]}},
        {"maintenance": {"windows": [weekly, {**weekly, "name": "v"}, dict(weekly), dict(weekly)]}},
        {"maintenance": {"windows": [weekly, one_off]}},
        {"maintenance": {"windows": [{**weekly, "duration": "9999d"}]}},
        {"maintenance": {"windows": [{**weekly, "duration": "7d1s"}]}},
        {"maintenance": {"windows": [{**weekly, "duration": "99999999s"}]}},
        {"maintenance": {"windows": [{**weekly, "duration": "167h60m"}, {**weekly, "name": "v", "duration": "7d"}]}},
        {"etcdSnapshots": {"path": "/var/lib/ichord/snapshots", "retain": 99999999999}},
        {"etcdSnapshots": {"path": "/var/lib/ichord/snapshots", "retain": 1000}},
        {"maintenance": {"windows": [{**one_off, "end": "2026-12-31T20:00:01Z"}]}},
        {"maintenance": {"windows": [{**one_off, "end": "2026-12-31T22:00:00+02:00"}]}},  # exactly 168h
    ))]
    added = await w.call("PATCH", f"{base}/lm-6", [{"op": "add", "path": "/spec/maintenance/windows/-",
                                                    "value": {**one_off, "name": "v"}}],
                         content_type="application/json-patch+json")
    return [(a.code, a.reason, a.field("message"), a.field("details", "causes")) for a in (*answers, added)]


async def kubectl_bodies(w: Wire, ns: str, side: Side) -> Observed:
    out = []
    for args in (("create", "namespace", f"{ns}-k"),
                 ("create", "secret", "generic", "s1", "-n", ns, "--from-literal=k=v"),
                 ("get", "secret", "s1", "-n", ns, "-o", "jsonpath={.type} {.data.k}"),
                 ("create", "configmap", "c1", "-n", ns, "--from-literal=a=b"),
                 ("get", "configmaps", "-n", ns, "--sort-by=.metadata.name", "-o", "name"),
                 ("get", "events", "-n", ns, "--sort-by=.lastTimestamp")):
        # In a thread: the simulator answers from this test's own event loop.
        answer = await anyio.to_thread.run_sync(functools.partial(run_kubectl, side.kubeconfig, *args, check=False))
        # The simulator's kube-controller-manager publishes kube-root-ca.crt; the real tier runs none.
        out.append("\n".join(line for line in answer.strip().splitlines() if ROOT_CA not in line))
    return out


SCENARIOS: dict[str, Scenario] = {
    "create, get, update, delete and their errors": crud_and_conflicts,
    "merge, JSON and strategic-merge patches": patches,
    "strategic merge of containers by name": strategic_merge_by_name,
    "server-side apply and its conflicts": server_side_apply,
    "status subresource and generation": status_subresource,
    "finalizers and delete preconditions": finalizers_and_preconditions,
    "label and field selectors": selectors,
    "watch from a resourceVersion": watch_events,
    "watch-list: the initial-events-end bookmark": initial_events_end_bookmark,
    "410 Gone on an expired watch": expired_watch,
    "schema, field-validation and CEL errors": validation_errors,
    "kubectl's protobuf bodies and --sort-by": kubectl_bodies,
    "field validation of unknown fields: Warn, Ignore, Strict, apply": field_validation,
    "list-type map keys and bounds of a TalosCluster": list_map_keys_and_bounds,
}


# ---- the two sides --------------------------------------------------------------------------


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSimulator]:
    async with KubeSimulator() as s:
        yield s


@pytest.mark.parametrize("title", list(SCENARIOS))
async def test_the_simulator_answers_as_kube_apiserver_does(title: str, sim: KubeSimulator, control_plane: ControlPlane,
                                                            crds: list[str], tmp_path: Path) -> None:
    scenario = SCENARIOS[title]
    ns = f"diff-{next(_SEQ)}-{scenario.__name__.replace('_', '-')}"[:50]
    sim_kubeconfig = sim.write_kubeconfig(tmp_path / "sim.kubeconfig")
    observed = {}
    for label, side in (("simulator", Side(sim_kubeconfig, sim=sim)),
                        ("kube-apiserver", Side(control_plane.admin_kubeconfig, plane=control_plane))):
        async with Wire(side.kubeconfig, tmp_path / label) as w:
            created = await w.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": ns}})
            assert created.code == 201, (label, created)
            observed[label] = json.loads(json.dumps(await scenario(w, ns, side)))
    assert observed["simulator"] == observed["kube-apiserver"], _diff(observed)


def _diff(observed: dict[str, Observed]) -> str:
    sim, real = observed["simulator"], observed["kube-apiserver"]
    lines = ["the simulator differs from kube-apiserver:"]
    for i, (a, b) in enumerate(itertools.zip_longest(sim, real)):
        mark = "  " if a == b else "!!"
        lines.append(f"{mark} [{i}] simulator:      {json.dumps(a)}")
        if a != b:
            lines.append(f"{mark} [{i}] kube-apiserver: {json.dumps(b)}")
    return "\n".join(lines)
