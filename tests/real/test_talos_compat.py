"""The compatibility tier: Talos's own Go client (tools/talos-compat, machinery v1.13.9 and v1.14.1) drives a
simulated cluster (3 control planes, 1 worker) the way talosctl does — a talosconfig machinery made from the
bundle, one endpoint (cp-1), other nodes reached with ``node`` or one-to-many ``nodes`` metadata — and each
call's result, decoded with machinery's types, is compared with what the simulated cluster's state says it
must be. One case per call and contract; a contract's cases skip only when its binary is not built."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from ichord.contract import V1_13, V1_14
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.talos.cosi import TYPES
from ichord.sim.talos.kubeconfig import admin_kubeconfig
from ichord.sim.talos.testing import eventually
from tests.real import tools
from tests.real.talos_compat import ServedCluster

CONTRACTS = {"v1.13": V1_13, "v1.14": V1_14}
FIRST = {"v1.13": 151, "v1.14": 161}  # each contract's cluster on its own loopback addresses
_SERVED: dict[str, ServedCluster] = {}


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
def served_clusters(bundle: SecretsBundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"bundle": bundle, "tmp": tmp_path_factory}
    yield state
    for cluster in _SERVED.values():
        cluster.stop()
    _SERVED.clear()


def served(state: dict[str, Any], contract: str) -> ServedCluster:
    reason = tools.missing(f"talos-compat-{contract}")
    if reason:
        pytest.skip(reason)
    if contract not in _SERVED:
        cluster = ServedCluster(state["bundle"], CONTRACTS[contract], FIRST[contract],
                                Path(state["tmp"].mktemp(f"compat-{contract}")))
        cluster.start()
        _SERVED[contract] = cluster
    return _SERVED[contract]


# ---- helpers -------------------------------------------------------------------------------------------

def ok(result: dict[str, Any]) -> Any:
    assert result["ok"], f"{result.get('code')}: {result.get('error')}"
    return result["result"]


def refused(result: dict[str, Any], code: str, *fragments: str) -> str:
    assert not result["ok"], f"expected {code}, the call succeeded: {result.get('result')}"
    assert result["code"] == code, result
    for fragment in fragments:
        assert fragment in result["message"], result
    return str(result["message"])


def messages(result: dict[str, Any]) -> list[dict[str, Any]]:
    return list(ok(result).get("messages", []))


def by_host(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m.get("metadata", {}).get("hostname", ""): m for m in items}


def pem(text: str) -> bytes:
    return base64.b64decode(text)


def spec(result: dict[str, Any]) -> Any:
    return ok(result)["spec"]


def config_file(c: ServedCluster, name: str, data: bytes) -> str:
    path = c.workdir / name
    path.write_bytes(data)
    return str(path)


# ---- the cases -----------------------------------------------------------------------------------------
# Each takes the served cluster of one contract. They run in this order on one cluster per contract; those
# that change it (restarts, applies, reboots) leave it running again.

def version_endpoint(c: ServedCluster) -> None:
    (msg,) = messages(c.call("version"))
    assert msg["version"]["tag"] == c.cluster.version_tag(c.contract)
    assert "metadata" not in msg  # answered by the endpoint itself: apid adds no metadata


def version_node(c: ServedCluster) -> None:
    before = c.read(lambda: c.node("cp-2").rpcs["Version"])
    (msg,) = messages(c.call("version", node=c.ip("cp-2")))
    assert msg["version"]["tag"] == c.cluster.version_tag(c.contract)
    assert "metadata" not in msg  # one-to-one proxying passes the answer through untouched
    assert c.read(lambda: c.node("cp-2").rpcs["Version"]) == before + 1


def version_nodes(c: ServedCluster) -> None:
    names = ["cp-1", "cp-2", "cp-3", "worker-1"]
    got = by_host(messages(c.call("version", nodes=[c.ip(n) for n in names])))
    assert set(got) == {c.ip(n) for n in names}
    assert {m["version"]["tag"] for m in got.values()} == {c.cluster.version_tag(c.contract)}


def version_nodes_by_name(c: ServedCluster) -> None:
    got = by_host(messages(c.call("version", nodes=["cp-2", "worker-1"])))
    assert set(got) == {"cp-2", "worker-1"}  # the hostname is the target as the client named it


def services_node(c: ServedCluster) -> None:
    (msg,) = messages(c.call("services", node=c.ip("worker-1")))
    want = c.read(lambda: {s: (v.state, c.node("worker-1").service_healthy(s))
                           for s, v in c.node("worker-1").services.items()})
    assert {s["id"]: (s["state"], s.get("health", {}).get("healthy", False)) for s in msg["services"]} == want


def services_nodes(c: ServedCluster) -> None:
    got = by_host(messages(c.call("services", nodes=[c.ip("cp-2"), c.ip("worker-1")])))
    for name in ("cp-2", "worker-1"):
        assert sorted(s["id"] for s in got[c.ip(name)]["services"]) == sorted(c.read(
            lambda n=name: list(c.node(n).services)))  # type: ignore[misc]
    assert "etcd" not in [s["id"] for s in got[c.ip("worker-1")]["services"]]


def service_restart(c: ServedCluster) -> None:
    before = c.read(lambda: len(c.cluster.history.of("kubelet_restart", "worker-1")))
    (msg,) = messages(c.call("service-restart", node=c.ip("worker-1"), id="kubelet"))
    assert msg["resp"] == 'Service "kubelet" restarted'
    c.run(_eventually(lambda: len(c.cluster.history.of("kubelet_restart", "worker-1")) == before + 1
                      and c.node("worker-1").services["kubelet"].state == "Running"))
    assert c.read(lambda: c.cluster.history.of("kubelet_restart", "worker-1")[-1]["reason"]) == "ServiceRestart"


def etcd_members(c: ServedCluster) -> None:
    (msg,) = messages(c.call("etcd-members", node=c.ip("cp-1")))
    want = c.read(lambda: {m.name: m.member_id for m in c.cluster.etcd.members.values()})
    assert {m["hostname"]: int(m["id"]) for m in msg["members"]} == want


def etcd_members_nodes(c: ServedCluster) -> None:
    got = by_host(messages(c.call("etcd-members", nodes=[c.ip("cp-2"), c.ip("cp-3")])))
    want = c.read(lambda: sorted(c.cluster.etcd.members))
    for name in ("cp-2", "cp-3"):
        assert sorted(m["hostname"] for m in got[c.ip(name)]["members"]) == want


def etcd_status(c: ServedCluster) -> None:
    (msg,) = messages(c.call("etcd-status", node=c.ip("cp-2")))
    etcd = c.cluster.etcd
    want = c.read(lambda: (etcd.members["cp-2"].member_id, etcd.members[etcd.leader].member_id))
    status = msg["member_status"]
    assert (int(status["member_id"]), int(status["leader"])) == want


def etcd_alarms(c: ServedCluster) -> None:
    (msg,) = messages(c.call("etcd-alarms", node=c.ip("cp-3")))
    want = c.read(lambda: c.cluster.etcd.members["cp-3"].alarms)
    assert len(msg.get("member_alarms", [])) == len(want)


def etcd_forfeit(c: ServedCluster) -> None:
    leader = c.read(lambda: c.cluster.etcd.leader)
    assert leader is not None
    (msg,) = messages(c.call("etcd-forfeit", node=c.ip(leader)))
    now = c.read(lambda: c.cluster.etcd.leader)
    assert now != leader and msg["member"] == now


def etcd_snapshot(c: ServedCluster) -> None:
    got = ok(c.call("etcd-snapshot", node=c.ip("cp-3")))
    assert got["size"] == c.read(lambda: c.cluster.history.of("etcd_snapshot", "cp-3")[-1]["size"])


def kubeconfig(c: ServedCluster) -> None:
    got = yaml.safe_load(ok(c.call("kubeconfig", node=c.ip("cp-2")))["kubeconfig"])
    want = yaml.safe_load(c.read(lambda: admin_kubeconfig(c.node("cp-2").view)))
    assert got["clusters"] == want["clusters"]
    assert got["contexts"] == want["contexts"]


def kubeconfig_nodes(c: ServedCluster) -> None:
    # talosctl kubeconfig -n CP on v1.13: the one-to-many stream, each chunk with the node's hostname
    got = yaml.safe_load(ok(c.call("kubeconfig", nodes=[c.ip("cp-1")]))["kubeconfig"])
    assert got["clusters"] == yaml.safe_load(c.read(lambda: admin_kubeconfig(c.node("cp-1").view)))["clusters"]


def read_boot_id(c: ServedCluster) -> None:
    data = ok(c.call("read", node=c.ip("worker-1"), path="/proc/sys/kernel/random/boot_id"))["data"]
    assert data.strip() == c.read(lambda: c.node("worker-1").boot_id)


def get(namespace: str, rtype: str, rid: str, node: str,
        check: Callable[[ServedCluster, Any], None]) -> Callable[[ServedCluster], None]:
    def case(c: ServedCluster) -> None:
        result = ok(c.call("get", node=c.ip(node), namespace=namespace, type=rtype, id=rid))
        assert "typed.Resource" in result["goType"] or "config.MachineConfig" in result["goType"], result["goType"]
        assert (result["namespace"], result["type"], result["id"]) == (namespace, rtype, rid)
        check(c, result["spec"])
    return case


def _machine_config(node: str, which: str) -> Callable[[ServedCluster, Any], None]:
    def check(c: ServedCluster, spec: Any) -> None:
        cfg = c.read(lambda: c.node(node).running if which == "v1alpha1" else c.node(node).persistent)
        assert spec["machineType"] == cfg.v1alpha1["machine"]["type"]
        docs = [d for d in yaml.safe_load_all(spec["bytes"]) if d]
        assert docs[0]["machine"]["ca"]["crt"] == cfg.v1alpha1["machine"]["ca"]["crt"]
        assert docs[0]["machine"]["token"] == cfg.v1alpha1["machine"]["token"]
    return check


def _os_root(node: str) -> Callable[[ServedCluster, Any], None]:
    def check(c: ServedCluster, spec: Any) -> None:
        view = c.read(lambda: c.node(node).view)
        assert pem(spec["IssuingCA"]["Crt"]) == view.os_ca.cert_pem
        assert [pem(a["Crt"]) for a in spec["AcceptedCAs"] or []] == list(view.os_accepted)
    return check


def _kubernetes_root(c: ServedCluster, spec: Any) -> None:
    view = c.read(lambda: c.node("cp-1").view)
    assert view.k8s_issuing is not None
    assert pem(spec["IssuingCA"]["Crt"]) == view.k8s_issuing.cert_pem


def _etcd_root(c: ServedCluster, spec: Any) -> None:
    view = c.read(lambda: c.node("cp-2").view)
    assert view.etcd_ca is not None
    assert pem(spec["EtcdCA"]["Crt"]) == view.etcd_ca.cert_pem


def _etcd_certs(c: ServedCluster, spec: Any) -> None:
    view = c.read(lambda: c.node("cp-1").view)
    assert view.etcd_ca is not None
    issuer = x509.load_pem_x509_certificate(view.etcd_ca.signer_pem).subject
    for key in ("Etcd", "EtcdPeer", "EtcdAdmin", "EtcdAPIServer"):
        assert x509.load_pem_x509_certificate(pem(spec[key]["Crt"])).issuer == issuer


def _nodename(c: ServedCluster, spec: Any) -> None:
    assert spec["Nodename"] == c.read(lambda: c.node("worker-1").nodename)


def _machine_status(c: ServedCluster, spec: Any) -> None:
    assert (spec["Stage"], spec["Status"]["Ready"]) == ("running", True)


def _boot_id(c: ServedCluster, spec: Any) -> None:
    assert spec["BootID"] == c.read(lambda: c.node("cp-3").boot_id)


def list_static_pods(c: ServedCluster) -> None:
    items = ok(c.call("list", node=c.ip("cp-2"), namespace="k8s", type="StaticPodStatuses.kubernetes.talos.dev"))
    assert sorted(i["id"] for i in items) == sorted(c.read(
        lambda: [f"kube-system/{p}-{c.node('cp-2').nodename}"
                 for p in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]))
    apiserver = next(i for i in items if "kube-apiserver" in i["id"])
    container = apiserver["spec"]["containerStatuses"][0]["containerID"]
    assert container == c.read(lambda: c.node("cp-2").apiserver_container)


def list_services(c: ServedCluster) -> None:
    items = ok(c.call("list", node=c.ip("cp-3"), namespace="runtime", type="Services.v1alpha1.talos.dev"))
    assert sorted(i["id"] for i in items) == sorted(c.read(lambda: list(c.node("cp-3").services)))
    assert all(i["spec"]["Running"] for i in items)


def talosctl_get(alias: str, want: Callable[[ServedCluster], set[str]], node: str = "cp-1",
                 definition: str = "") -> Callable[[ServedCluster], None]:
    def case(c: ServedCluster) -> None:
        result = ok(c.call("talosctl-get", node=c.ip(node), type=alias))
        assert {i["id"] for i in result["items"]} == want(c)
        if definition:
            assert result["definition"] == definition
    return case


def resource_definitions(c: ServedCluster) -> None:
    served = ok(c.call("resource-definitions", node=c.ip("worker-1")))
    ids = {t.type.lower() for t in TYPES.values() if not (t.since_v114 and c.contract < V1_14)}
    assert {d["id"] for d in served} == ids
    for d in served:
        mine, theirs = d["served"], d["machinery"]
        assert theirs is not None, d["id"]  # every definition served is one machinery defines
        theirs["PrintColumns"] = theirs["PrintColumns"] or []
        assert mine == theirs, d["id"]


def watch_kind_bootstrapped(c: ServedCluster) -> None:
    names = c.read(lambda: sorted(c.node("worker-1").services))
    events = ok(c.call("watch", node=c.ip("worker-1"), namespace="runtime", type="Services.v1alpha1.talos.dev",
                       bootstrap=True, count=len(names) + 1))
    assert [(e["event"], e["resource"]["id"]) for e in events] == [
        *[("Created", n) for n in names], ("Bootstrapped", "")]


def watch_kind_follows(c: ServedCluster) -> None:
    node = c.node("worker-1")
    watchers = c.read(lambda: len(node._watchers))
    events = ok(c.call("watch", node=c.ip("worker-1"), namespace="runtime", type="Services.v1alpha1.talos.dev",
                       count=2, trigger=lambda: node.restart_service("kubelet"),
                       ready=lambda: len(node._watchers) > watchers))
    assert [(e["event"], e["resource"]["id"]) for e in events] == [("Destroyed", "kubelet"), ("Created", "kubelet")]
    c.run(_eventually(lambda: node.services["kubelet"].state == "Running"))


def watch_id(c: ServedCluster) -> None:
    events = ok(c.call("watch", node=c.ip("cp-2"), namespace="runtime", type="MachineStatuses.runtime.talos.dev",
                       id="machine", count=1))
    assert [(e["event"], e["resource"]["id"]) for e in events] == [("Created", "machine")]
    assert events[0]["resource"]["spec"]["Stage"] == "running"


def watch_id_updates(c: ServedCluster) -> None:
    node = c.node("worker-1")
    watchers = c.read(lambda: len(node._watchers))
    events = ok(c.call("watch", node=c.ip("worker-1"), namespace="runtime", type="Services.v1alpha1.talos.dev",
                       id="kubelet", count=3, trigger=lambda: node.restart_service("kubelet"),
                       ready=lambda: len(node._watchers) > watchers))
    assert [e["event"] for e in events] == ["Created", "Destroyed", "Created"]
    c.run(_eventually(lambda: node.services["kubelet"].state == "Running"))


def watch_id_absent(c: ServedCluster) -> None:
    events = ok(c.call("watch", node=c.ip("worker-1"), namespace="runtime", type="Services.v1alpha1.talos.dev",
                       id="etcd", count=1))
    assert [(e["event"], e["resource"]["id"], e["resource"]["version"]) for e in events] == [
        ("Destroyed", "etcd", "undefined")]


def events_tail(c: ServedCluster) -> None:
    events = ok(c.call("events", node=c.ip("cp-3"), tail=-1, count=2))
    assert [e["event"] for e in events] == ["machine BOOTING ready=false", "machine RUNNING ready=true"]
    assert all(e["type"] == "talos/runtime/machine.MachineStatusEvent" for e in events)


def events_nodes(c: ServedCluster) -> None:
    # the one-to-many stream: every node's hello and events, each with its hostname
    events = ok(c.call("events", nodes=[c.ip("cp-2"), c.ip("cp-3")], tail=-1, count=3))
    assert {e["node"] for e in events} <= {c.ip("cp-2"), c.ip("cp-3")}
    assert all(e["event"].startswith("machine ") for e in events)


def reboot_wait(node: str) -> Callable[[ServedCluster], None]:
    def case(c: ServedCluster) -> None:
        boots = c.read(lambda: c.node(node).boots)
        result = ok(c.call("reboot-wait", node=c.ip(node), timeout=60))
        assert result["before"] != result["after"]
        assert result["after"] == c.read(lambda: c.node(node).boot_id)
        assert c.read(lambda: c.node(node).boots) == boots + 1
        assert result["events"][0] == "sequence reboot START"
        assert result["events"][-1] == "machine RUNNING ready=true"
        rebooted = c.read(lambda: c.cluster.history.of("reboot_requested", node)[-1])
        assert rebooted["actor_id"] == result["actor"]
        c.run(_eventually(lambda: c.node(node).up))
    return case


def apply(mode: str, *, dry_run: bool = False, node: str = "worker-1") -> Callable[[ServedCluster], None]:
    def case(c: ServedCluster) -> None:
        data = c.read(lambda: c.node(node).running.to_bytes())  # noqa: PLW0108 - read on the loop, not now
        applies = c.read(lambda: len(c.cluster.history.of("apply", node)))
        extra = {"tryTimeout": 30.0} if mode == "TRY" else {}
        (msg,) = messages(c.call("apply", node=c.ip(node), mode=mode, dryRun=dry_run,
                                 file=config_file(c, f"apply-{mode}.yaml", data), **extra))
        used = {"AUTO": "NO_REBOOT"}.get(mode, mode)
        assert msg.get("mode", "REBOOT") == used
        if dry_run:
            assert msg["mode_details"].startswith("Dry run summary:")
            assert "No changes." in msg["mode_details"]
            assert c.read(lambda: len(c.cluster.history.of("apply", node))) == applies
        else:
            last = c.read(lambda: c.cluster.history.of("apply", node)[-1])
            assert last["mode"] == used
    return case


def apply_reboot_v113(c: ServedCluster) -> None:
    boots = c.read(lambda: c.node("worker-1").boots)
    data = c.read(lambda: c.node("worker-1").running.to_bytes())  # noqa: PLW0108 - read on the loop, not now
    (msg,) = messages(c.call("apply", node=c.ip("worker-1"), mode="REBOOT",
                             file=config_file(c, "apply-reboot.yaml", data)))
    assert msg.get("mode", "REBOOT") == "REBOOT"
    c.run(_eventually(lambda: c.node("worker-1").boots == boots + 1 and c.node("worker-1").up, within=30))


# ---- negative cases ------------------------------------------------------------------------------------

def refused_tls(cred: str, alert: str | None) -> Callable[[ServedCluster], None]:
    """A client certificate apid refuses: the client reads the TLS alert (apid's Go TLS stack sends "bad
    certificate" for each; the simulator's OpenSSL names the reason), never a bare EOF that looks like a network
    fault. ``alert`` None: refused after the handshake (apid's exact-ExtKeyUsage rule, which OpenSSL cannot
    apply during it), where the simulator can only close the connection."""
    def case(c: ServedCluster) -> None:
        refusals = c.read(lambda: len(c.cluster.history.of("handshake_refused", "cp-1")))
        message = refused(c.call("version", cred=cred), "Unavailable")
        if alert is not None:
            assert f"remote error: tls: {alert}" in message, message
        c.run(_eventually(lambda: len(c.cluster.history.of("handshake_refused", "cp-1")) > refusals))
    return case


def tls_advertises_accepted_cas(c: ServedCluster) -> None:
    """apid's CertificateRequest names the CAs it accepts client certificates from (its ClientCAs)."""
    result = ok(c.call("tls", cred="untrusted", address=c.endpoint, serverName=c.ip("cp-1")))
    trusted = c.read(lambda: c.node("cp-1").view.os_trust)
    assert [pem(n) for n in result["advertisedCAs"] or []] == [
        x509.load_pem_x509_certificate(ca).subject.public_bytes() for ca in trusted]
    assert result["read"] == "remote error: tls: unknown certificate authority"


def role_refused(op: str, cred: str, **kwargs: Any) -> Callable[[ServedCluster], None]:
    def case(c: ServedCluster) -> None:
        refused(c.call(op, cred=cred, **kwargs), "PermissionDenied", "not authorized")
    return case


def unknown_node(c: ServedCluster) -> None:
    refused(c.call("version", node="nosuch-node"), "Unavailable", "no such host")


def unknown_address(c: ServedCluster) -> None:
    refused(c.call("version", node="127.0.0.250"), "Unavailable", "connection refused")


def node_with_port(c: ServedCluster) -> None:
    refused(c.call("version", node=c.node("cp-2").endpoint), "Internal", "invalid target")


def nodes_one_unknown(c: ServedCluster) -> None:
    result = c.call("version", nodes=[c.ip("cp-2"), "nosuch-node"])
    assert not result["ok"] and "nosuch-node" in result["error"] and "no such host" in result["error"]
    got = by_host(result["result"]["messages"])
    assert got[c.ip("cp-2")]["version"]["tag"] == c.cluster.version_tag(c.contract)


def nodes_on_cosi(c: ServedCluster) -> None:
    refused(c.call("get", nodes=[c.ip("cp-2")], namespace="runtime", type="MachineStatuses.runtime.talos.dev",
                   id="machine"), "InvalidArgument", "one-2-many proxying is not supported for method "
                                                     "/cosi.resource.State/Get")


def apply_malformed(c: ServedCluster) -> None:
    refused(c.call("apply", node=c.ip("worker-1"), mode="NO_REBOOT", data="machine: [unclosed\n"),
            "InvalidArgument")


def apply_without_v1alpha1(c: ServedCluster) -> None:
    doc = "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: other\n"
    refused(c.call("apply", node=c.ip("worker-1"), mode="NO_REBOOT", data=doc), "InvalidArgument", "v1alpha1")


def apply_invalid(c: ServedCluster) -> None:
    data = c.read(lambda: c.node("worker-1").running.to_bytes()).replace(b"type: worker", b"type: bogus", 1)  # noqa: PLW0108 - read on the loop, not now
    refused(c.call("apply", node=c.ip("worker-1"), mode="NO_REBOOT", data=data.decode()), "InvalidArgument")


def apply_reboot_v114(c: ServedCluster) -> None:
    data = c.read(lambda: c.node("worker-1").running.to_bytes())  # noqa: PLW0108 - read on the loop, not now
    refused(c.call("apply", node=c.ip("worker-1"), mode="REBOOT", data=data.decode()), "Unimplemented")


def method_not_simulated(c: ServedCluster) -> None:
    refused(c.call("processes", node=c.ip("cp-2")), "Unimplemented", "not simulated")


def watch_id_with_bootstrap(c: ServedCluster) -> None:
    refused(c.call("raw-watch", node=c.ip("cp-2"), namespace="runtime", type="MachineStatuses.runtime.talos.dev",
                   id="machine", bootstrap=True, count=1),
            "Unimplemented", "bootstrap contents is not implemented for resource watch")


def get_absent(c: ServedCluster) -> None:
    refused(c.call("get", node=c.ip("worker-1"), namespace="runtime", type="Services.v1alpha1.talos.dev",
                   id="etcd"), "NotFound", "doesn't exist")


def talosctl_get_unregistered(c: ServedCluster) -> None:
    refused(c.call("talosctl-get", type="nosuchresources"), "NotFound", 'resource "nosuchresources" is not registered')


def service_restart_refused(c: ServedCluster) -> None:
    refused(c.call("service-restart", node=c.ip("cp-2"), id="etcd"), "Unknown",
            "doesn't support restart operation via API")


def etcd_on_worker(c: ServedCluster) -> None:
    assert not c.call("etcd-members", node=c.ip("worker-1"))["ok"]


CASES: list[tuple[str, Callable[[ServedCluster], None], tuple[str, ...]]] = [
    ("version", version_endpoint, ()),
    ("version-node", version_node, ()),
    ("version-nodes", version_nodes, ()),
    ("version-nodes-by-name", version_nodes_by_name, ()),
    ("services-node", services_node, ()),
    ("services-nodes", services_nodes, ()),
    ("service-restart", service_restart, ()),
    ("etcd-members", etcd_members, ()),
    ("etcd-members-nodes", etcd_members_nodes, ()),
    ("etcd-status", etcd_status, ()),
    ("etcd-alarms", etcd_alarms, ()),
    ("etcd-forfeit-leadership", etcd_forfeit, ()),
    ("etcd-snapshot", etcd_snapshot, ()),
    ("kubeconfig", kubeconfig, ()),
    ("kubeconfig-nodes", kubeconfig_nodes, ()),
    ("read-boot-id", read_boot_id, ()),
    ("get-machineconfig-running", get("config", "MachineConfigs.config.talos.dev", "v1alpha1", "cp-2",
                                      _machine_config("cp-2", "v1alpha1")), ()),
    ("get-machineconfig-persistent", get("config", "MachineConfigs.config.talos.dev", "persistent", "worker-1",
                                         _machine_config("worker-1", "persistent")), ()),
    ("get-nodename", get("k8s", "Nodenames.kubernetes.talos.dev", "nodename", "worker-1", _nodename), ()),
    ("get-machinestatus", get("runtime", "MachineStatuses.runtime.talos.dev", "machine", "cp-1",
                              _machine_status), ()),
    ("get-bootid", get("runtime", "BootIDs.runtime.talos.dev", "boot-id", "cp-3", _boot_id), ("v1.14",)),
    ("get-osroot", get("secrets", "OSRootSecrets.secrets.talos.dev", "os", "cp-2", _os_root("cp-2")), ()),
    ("get-osroot-worker", get("secrets", "OSRootSecrets.secrets.talos.dev", "os", "worker-1",
                              _os_root("worker-1")), ()),
    ("get-kubernetesroot", get("secrets", "KubernetesRootSecrets.secrets.talos.dev", "k8s", "cp-1",
                               _kubernetes_root), ()),
    ("get-etcdroot", get("secrets", "EtcdRootSecrets.secrets.talos.dev", "etcd", "cp-2", _etcd_root), ()),
    ("get-etcdsecrets", get("secrets", "EtcdSecrets.secrets.talos.dev", "etcd", "cp-1", _etcd_certs), ()),
    ("list-staticpodstatuses", list_static_pods, ()),
    ("list-services", list_services, ()),
    ("talosctl-get-svc", talosctl_get("svc", lambda c: set(c.read(lambda: list(c.node("cp-1").services))),
                                      definition="services.v1alpha1.talos.dev"), ()),
    ("talosctl-get-machinestatus", talosctl_get("machinestatus", lambda c: {"machine"}), ()),
    ("talosctl-get-mc", talosctl_get("mc", lambda c: {"persistent", "v1alpha1"}, node="worker-1"), ()),
    ("talosctl-get-api-resources", talosctl_get(
        "api-resources", lambda c: {t.type.lower() for t in TYPES.values()
                                    if not (t.since_v114 and c.contract < V1_14)}), ()),
    ("resource-definitions", resource_definitions, ()),
    ("watch-kind-bootstrapped", watch_kind_bootstrapped, ()),
    ("watch-kind-follows", watch_kind_follows, ()),
    ("watch-id", watch_id, ()),
    ("watch-id-updates", watch_id_updates, ()),
    ("watch-id-absent", watch_id_absent, ()),
    ("events-tail", events_tail, ()),
    ("events-nodes", events_nodes, ()),
    ("apply-dry-run-no-reboot", apply("NO_REBOOT", dry_run=True), ()),
    ("apply-dry-run-auto", apply("AUTO", dry_run=True), ()),
    ("apply-no-reboot", apply("NO_REBOOT"), ()),
    ("apply-auto", apply("AUTO"), ()),
    ("apply-staged", apply("STAGED"), ()),
    ("apply-try", apply("TRY"), ()),
    ("apply-reboot", apply_reboot_v113, ("v1.13",)),
    ("reboot-wait-worker", reboot_wait("worker-1"), ()),
    ("reboot-wait-endpoint", reboot_wait("cp-1"), ()),
    # negative cases
    # the server names the CAs it accepts, so Talos's client offers no certificate from another CA: the alert
    # is apid's "certificate required", what talosctl shows for a talosconfig of another cluster
    ("refused-untrusted-cert", refused_tls("untrusted", "certificate required"), ()),
    ("refused-expired-cert", refused_tls("expired", "expired certificate"), ()),
    ("refused-server-usage-cert", refused_tls("server-usage", "unsupported certificate"), ()),
    ("refused-two-usages-cert", refused_tls("both-usages", None), ()),
    ("refused-cert-names-accepted-cas", tls_advertises_accepted_cas, ()),
    ("reader-cannot-apply", role_refused("apply", "reader", mode="NO_REBOOT", data="x"), ()),
    ("reader-cannot-reboot", role_refused("reboot", "reader"), ()),
    ("reader-cannot-read-secrets", role_refused("get", "reader", namespace="secrets",
                                                type="OSRootSecrets.secrets.talos.dev", id="os"), ()),
    ("operator-cannot-read-kubeconfig", role_refused("kubeconfig", "operator"), ()),
    ("unknown-node", unknown_node, ()),
    ("unknown-address", unknown_address, ()),
    ("node-with-port", node_with_port, ()),
    ("nodes-one-unknown", nodes_one_unknown, ()),
    ("nodes-on-cosi", nodes_on_cosi, ()),
    ("apply-malformed", apply_malformed, ()),
    ("apply-without-v1alpha1", apply_without_v1alpha1, ()),
    ("apply-invalid", apply_invalid, ()),
    ("apply-reboot-refused", apply_reboot_v114, ("v1.14",)),
    ("method-not-simulated", method_not_simulated, ()),
    ("watch-id-with-bootstrap", watch_id_with_bootstrap, ()),
    ("get-absent", get_absent, ()),
    ("talosctl-get-unregistered", talosctl_get_unregistered, ()),
    ("service-restart-refused", service_restart_refused, ()),
    ("etcd-on-worker", etcd_on_worker, ()),
]


@pytest.mark.parametrize("contract", list(CONTRACTS))
@pytest.mark.parametrize("case", [c for c, _, _ in CASES])
def test_talos_compat(case: str, contract: str, served_clusters: dict[str, Any]) -> None:
    name, fn, only = next(c for c in CASES if c[0] == case)
    if only and contract not in only:
        pytest.skip(f"{name} is a {', '.join(only)} behaviour")
    fn(served(served_clusters, contract))


async def _eventually(predicate: Callable[[], bool], within: float = 15.0) -> None:
    await eventually(predicate, within=within, step=0.01)
