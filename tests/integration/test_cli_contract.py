"""Every command's exit code and output on success, bad input and conflict: the CLI contract of README "Commands".

    0  success
    1  a runtime failure (the API server did not answer)
    2  bad input or a refusal, and nothing was written

Each case runs the real entry point (``ichord.cli.main``) against the Kubernetes API simulator over HTTPS with a
kubeconfig, as an operator runs it, in a world of four clusters in namespace ``clusters``:

    demo      v1.14, a worker waiting for a reboot (config-apply has something to do), a bundle Secret
    calm      v1.13, nothing waits
    busy      a ca-rotation of it is under way (stage Issuing, paused)
    rotating  its bundle Secret holds rotation.yaml
    early     a ca-rotation of it is in Accepting (the operator's hand-off comes later)
    held      a plan-only ca-rotation of it (spec.paused, not started): only a person moves it on
    stuck     a ca-rotation of it is Blocked in its preflight (the daemon retries it)
    twin      names demo's bundle Secret; demo, created first, holds it (Ready=False/BundleInUse, as the daemon says)
    gone      being deleted (deletionTimestamp set, a finalizer holding it), a worker waiting for a reboot

and in the test's directory an unrelated ``precious.yaml`` (another cluster's bundle), ``foreign/kubeconfig`` and the
empty ``creds/`` and ``export/``.

A refusal (exit 2) or a failure (exit 1) must leave the API exactly as it was: no create, update, patch or delete
reached the simulator, and no file was written or changed; what it says is one line, ``ichord: ...``, last (a
progress note such as "waiting for ..." may come before it), and never a traceback.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord import yamlio
from ichord.api.names import BUNDLE_EXPORTED_ANNOTATION
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.status import update_status
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.kube import KubeSimulator
from tests.integration._rehearsal import cli as run_cli

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NS = "clusters"
WRITES = ("create", "update", "patch", "delete")


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@dataclass
class World:
    sim: KubeSimulator
    kube: KubeClient
    kubeconfig: Path
    dead_kubeconfig: Path  # the same file pointing at a closed port
    tmp: Path
    bundle_file: Path

    def fill(self, text: str) -> str:
        return (text.replace("{kc}", str(self.kubeconfig)).replace("{dead}", str(self.dead_kubeconfig))
                .replace("{tmp}", str(self.tmp)).replace("{bundle}", str(self.bundle_file)))

    async def operations(self) -> list[dict[str, Any]]:
        return (await crds.operations(self.kube).list_objects(NS))[0]

    async def inventory(self) -> dict[str, str]:
        """Every object ichord's commands may touch, by kind/name -> resourceVersion."""
        out: dict[str, str] = {}
        for kind, objs in (("op", await self.operations()),
                           ("cluster", (await crds.clusters(self.kube).list_objects(NS))[0]),
                           ("machine", (await crds.machines(self.kube).list_objects(NS))[0])):
            for o in objs:
                out[f"{kind}/{o['metadata']['name']}"] = str(o["metadata"]["resourceVersion"])
        return out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _secret(kube: KubeClient, name: str, data: dict[str, bytes]) -> None:
    await kube.raw("POST", f"/api/v1/namespaces/{NS}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()}})


async def _cluster(kube: KubeClient, name: str, talos: str, secrets: dict[str, bytes]) -> None:
    await _secret(kube, f"{name}-bundle", secrets)
    await crds.clusters(kube).create(NS, {"metadata": {"name": name, "namespace": NS}, "spec": {
        "secretsRef": {"name": f"{name}-bundle"}, "endpoint": f"https://{name}.example:6443",
        "kubernetesVersion": "1.34.1", "talosVersion": talos}})


async def _machine(kube: KubeClient, cluster: str, name: str, role: str, reboot_paths: list[str]) -> None:
    await crds.machines(kube).create(NS, {"metadata": {"name": f"{cluster}-{name}", "namespace": NS}, "spec": {
        "clusterRef": {"name": cluster}, "role": role, "address": "10.0.0.9", "approved": True}})
    if reboot_paths:
        await update_status(crds.machines(kube), NS, f"{cluster}-{name}",
                            lambda s, _o: {**s, "rebootPaths": reboot_paths})


@pytest.fixture(scope="module")
def other_bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def world(bundle: SecretsBundle, other_bundle: SecretsBundle, tmp_path: Path) -> AsyncIterator[World]:
    async with KubeSimulator() as sim:
        kc = sim.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        dead = tmp_path / "dead-kubeconfig"
        cfg = yamlio.load(kc.read_text())
        cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{closed_port()}"
        dead.write_text(yamlio.dump(cfg))
        kube = await from_kubeconfig(kc)
        try:
            await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
            raw = bundle.to_yaml().encode()
            await _cluster(kube, "demo", "v1.14", {"secrets.yaml": raw})
            await _machine(kube, "demo", "cp-1", "controlplane", [])
            await _machine(kube, "demo", "worker-1", "worker", ["machine.env"])
            await _cluster(kube, "calm", "v1.13", {"secrets.yaml": raw})
            await _machine(kube, "calm", "cp-1", "controlplane", [])
            await _cluster(kube, "busy", "v1.14", {"secrets.yaml": raw})
            await _machine(kube, "busy", "worker-1", "worker", ["machine.env"])
            await crds.operations(kube).create(NS, {"metadata": {"name": "busy-rotation", "namespace": NS}, "spec": {
                "clusterRef": {"name": "busy"}, "kind": "ca-rotation", "paused": True}})
            await update_status(crds.operations(kube), NS, "busy-rotation", lambda s, _o: {
                **s, "phase": "InProgress", "caRotation": {"stage": "Issuing"}})
            await _cluster(kube, "rotating", "v1.14", {"secrets.yaml": raw, "rotation.yaml": b"talos: {}\n"})
            await _cluster(kube, "early", "v1.14", {"secrets.yaml": raw})
            await crds.operations(kube).create(NS, {"metadata": {"name": "early-rotation", "namespace": NS}, "spec": {
                "clusterRef": {"name": "early"}, "kind": "ca-rotation"}})
            await update_status(crds.operations(kube), NS, "early-rotation", lambda s, _o: {
                **s, "phase": "InProgress", "caRotation": {"stage": "Accepting"}})
            await _cluster(kube, "held", "v1.14", {"secrets.yaml": raw})
            await crds.operations(kube).create(NS, {"metadata": {"name": "held-rotation", "namespace": NS}, "spec": {
                "clusterRef": {"name": "held"}, "kind": "ca-rotation", "paused": True}})
            await _cluster(kube, "stuck", "v1.14", {"secrets.yaml": raw})
            await crds.operations(kube).create(NS, {"metadata": {"name": "stuck-rotation", "namespace": NS}, "spec": {
                "clusterRef": {"name": "stuck"}, "kind": "ca-rotation"}})
            await update_status(crds.operations(kube), NS, "stuck-rotation", lambda s, _o: {
                **s, "phase": "Paused", "conditions": [{
                    "type": "CARotation", "status": "False", "reason": "Blocked",
                    "message": "preflight: machine stuck-cp-1 (10.0.0.9) does not answer: connection refused",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
            await _cluster(kube, "twin", "v1.14", {"secrets.yaml": raw})
            await crds.clusters(kube).patch(NS, "twin", {"spec": {"secretsRef": {"name": "demo-bundle"}}})
            await update_status(crds.clusters(kube), NS, "twin", lambda s, _o: {**s, "conditions": [{
                "type": "Ready", "status": "False", "reason": "BundleInUse",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": f"the bundle Secret {NS}/demo-bundle is TalosCluster {NS}/demo's (created first); ... Give "
                           f"it a bundle of its own in spec.secretsRef (`kubectl -n {NS} edit taloscluster twin`), or "
                           "delete it"}]})
            await _cluster(kube, "gone", "v1.14", {"secrets.yaml": raw})
            await _machine(kube, "gone", "worker-1", "worker", ["machine.env"])
            await crds.clusters(kube).patch(NS, "gone", {"metadata": {"finalizers": ["example.com/hold"]}})
            await kube.raw("DELETE", f"/apis/ichor.maesh.dev/v1alpha1/namespaces/{NS}/talosclusters/gone")
            bundle_file = tmp_path / "secrets.yaml"
            bundle_file.write_bytes(raw)
            bundle_file.chmod(0o600)
            (tmp_path / "precious.yaml").write_bytes(other_bundle.to_yaml().encode())
            (tmp_path / "creds").mkdir()
            (tmp_path / "export").mkdir()
            (tmp_path / "foreign").mkdir()
            (tmp_path / "foreign" / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
            yield World(sim, kube, kc, dead, tmp_path, bundle_file)
        finally:
            await kube.close()


@dataclass(frozen=True)
class Case:
    id: str
    argv: str  # split on spaces after {kc} {dead} {tmp} {bundle} are filled in
    rc: int
    out: str = ""  # a piece of stdout ('' : anything; for rc != 0 stdout must be empty)
    err: str = ""  # a piece of stderr
    #: What a successful case must have done (checked against the world after the command).
    then: Callable[[World, str], Any] | None = field(default=None, compare=False)


K = "-n clusters --kubeconfig {kc}"


async def _one_config_op(w: World, out: str) -> None:
    ops = [o for o in await w.operations() if o["spec"]["clusterRef"]["name"] == "demo"]
    assert len(ops) == 1 and ops[0]["spec"]["kind"] == "config", ops


async def _json_config_op_started(w: World, out: str) -> None:
    op = json.loads(out)
    assert op["spec"] == {"clusterRef": {"name": "demo"}, "kind": "config", "paused": False}
    assert [o["metadata"]["name"] for o in await w.operations()
            if o["spec"]["clusterRef"]["name"] == "demo"] == [op["metadata"]["name"]]


async def _default_rotation(w: World, out: str) -> None:
    ops = [o for o in await w.operations() if o["spec"]["clusterRef"]["name"] == "demo"]
    assert len(ops) == 1 and ops[0]["spec"] == {"clusterRef": {"name": "demo"}, "kind": "ca-rotation",
                                                "paused": True}, ops
    # The start hint works pasted as printed: it names this kubeconfig.
    assert f"kubectl --kubeconfig {w.kubeconfig} -n {NS} patch talosoperation {ops[0]['metadata']['name']}" in out


async def _yaml_rotation(w: World, out: str) -> None:
    op = yamlio.load(out)
    assert op["spec"]["caRotation"] == {"targets": ["talos", "etcd"]} and op["spec"]["paused"] is False
    assert op["spec"]["maxUnavailable"] == 2


async def _status_json(w: World, out: str) -> None:
    data = json.loads(out)
    assert data["cluster"]["metadata"]["name"] == "demo"
    assert sorted(m["metadata"]["name"] for m in data["machines"]) == ["demo-cp-1", "demo-worker-1"]
    assert data["operations"] == [] and data["next"] == {"operations": {}, "cluster": None}


async def _status_yaml_busy(w: World, out: str) -> None:
    data = yamlio.load(out)
    assert [o["metadata"]["name"] for o in data["operations"]] == ["busy-rotation"]
    assert set(data["next"]["operations"]) == {"busy-rotation"}


async def _exported(w: World, out: str) -> None:
    path = w.tmp / "export" / "secrets.yaml"
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_bytes() == w.bundle_file.read_bytes()
    cluster = await crds.clusters(w.kube).get(NS, "demo")
    assert BUNDLE_EXPORTED_ANNOTATION in cluster["metadata"]["annotations"]


async def _forced(w: World, out: str) -> None:
    assert (w.tmp / "precious.yaml").read_bytes() == w.bundle_file.read_bytes()


async def _generated(w: World, out: str) -> None:
    assert (w.tmp / "new.yaml").stat().st_mode & 0o777 == 0o600


CASES = [
    # -- the parser: bad input is exit 2 before anything runs
    Case("no-command", "", 2, err="required: COMMAND"),
    Case("unknown-command", "frobnicate", 2, err="invalid choice"),
    Case("version", "--version", 0, out="ichord "),
    Case("cluster-no-subcommand", "cluster", 2, err="required: SUBCOMMAND"),
    # -- bundle generate
    Case("generate", "bundle generate -f {tmp}/new.yaml", 0, out="wrote {tmp}/new.yaml", then=_generated),
    Case("generate-deprecated-o", "bundle generate -o {tmp}/new.yaml", 0, out="wrote",
         err="-o is deprecated here; use -f/--file", then=_generated),
    Case("generate-exists", "bundle generate -f {bundle}", 2, err="--force"),
    Case("generate-bad-version", "bundle generate --talos-version v9.9 -f {tmp}/x.yaml", 2, err="v9.9"),
    # -- render
    Case("render", "render --bundle {bundle} --cluster-name demo --endpoint https://demo:6443 "
         "--kubernetes-version 1.34.1 --role worker", 0, out="machine"),
    Case("render-no-bundle", "render --cluster-name demo --endpoint https://demo:6443 --kubernetes-version 1.34.1",
         2, err="--bundle"),
    Case("render-missing-bundle", "render --bundle {tmp}/none.yaml --cluster-name demo --endpoint "
         "https://demo:6443 --kubernetes-version 1.34.1", 2, err="none.yaml"),
    Case("render-bad-role", "render --bundle {bundle} --role queen", 2, err="invalid choice"),
    Case("render-diff-missing", "render diff {tmp}/a.yaml {tmp}/b.yaml --talos-version v1.14", 2, err="a.yaml"),
    # -- cluster status
    Case("status", f"cluster status demo {K}", 0, out="TalosCluster clusters/demo"),
    Case("status-json", f"cluster status demo {K} -o json", 0, then=_status_json),
    Case("status-yaml-busy", f"cluster status busy {K} -o yaml", 0, then=_status_yaml_busy),
    Case("status-next-has-kubeconfig", f"cluster status busy {K}", 0,
         out="next: kubectl --kubeconfig {kc} -n clusters patch top busy-rotation --type merge"),
    Case("status-missing", f"cluster status nope {K}", 2, err="TalosCluster clusters/nope not found"),
    Case("status-bad-format", f"cluster status demo {K} -o xml", 2, err="invalid choice"),
    Case("status-no-kubeconfig", "cluster status demo -n clusters --kubeconfig {tmp}/none", 2,
         err="does not exist"),
    Case("status-unreachable", "cluster status demo -n clusters --kubeconfig {dead}", 1, err="connection refused"),
    # -- cluster config-apply
    Case("config-apply", f"cluster config-apply demo {K} --wait 0", 0, out="TalosOperation clusters/demo-config-",
         then=_one_config_op),
    Case("config-apply-json-start", f"cluster config-apply demo {K} --wait 0 --start -o json", 0,
         then=_json_config_op_started),
    Case("config-apply-missing", f"cluster config-apply nope {K} --wait 0", 2,
         err="TalosCluster clusters/nope not found; check the name and -n. Nothing was created."),
    Case("config-apply-nothing-to-do", f"cluster config-apply calm {K} --wait 0", 2,
         err="nothing to roll out. Nothing was created."),
    Case("config-apply-during-rotation", f"cluster config-apply busy {K} --wait 0", 2,
         err="a CA rotation, TalosOperation clusters/busy-rotation (InProgress, stage Issuing)"),
    Case("config-apply-bad-bound", f"cluster config-apply demo {K} --max-unavailable 0%", 2,
         err="--max-unavailable must be"),
    Case("config-apply-bad-wait", f"cluster config-apply demo {K} --wait -1", 2, err="--wait"),
    Case("config-apply-bad-format", f"cluster config-apply demo {K} -o table", 2, err="invalid choice"),
    Case("config-apply-unreachable", "cluster config-apply demo -n clusters --kubeconfig {dead} --wait 0", 1,
         err="connection refused"),
    # -- cluster rotate
    Case("rotate", f"cluster rotate demo {K} --wait 0", 0, out="TalosOperation clusters/demo-rotation-",
         then=_default_rotation),
    Case("rotate-yaml-targets", f"cluster rotate demo {K} --wait 0 --targets talos,etcd --start "
         "--max-unavailable 2 -o yaml", 0, then=_yaml_rotation),
    Case("rotate-missing", f"cluster rotate nope {K} --wait 0", 2, err="TalosCluster clusters/nope not found"),
    Case("rotate-busy", f"cluster rotate busy {K} --wait 0", 2, err="TalosOperation clusters/busy-rotation"),
    Case("rotate-unknown-target", f"cluster rotate demo {K} --targets talos,dns", 2,
         err="unknown CA-rotation target 'dns'"),
    Case("rotate-twice", f"cluster rotate demo {K} --targets etcd,etcd", 2, err="listed twice"),
    Case("rotate-empty-targets", f"cluster rotate demo {K} --targets ,", 2, err="--targets names no target"),
    Case("rotate-aggregator-on-v1.13", f"cluster rotate calm {K} --targets kubernetes-aggregator --wait 0", 2,
         err="Nothing was created."),
    Case("rotate-bad-bound", f"cluster rotate demo {K} --max-unavailable 0", 2, err="--max-unavailable must be"),
    Case("rotate-unreachable", "cluster rotate demo -n clusters --kubeconfig {dead} --wait 0", 1,
         err="connection refused"),
    # -- cluster bundle-export
    Case("export", f"cluster bundle-export demo {K} -f {{tmp}}/export/secrets.yaml", 0,
         out="export fingerprint", then=_exported),
    Case("export-deprecated-o", f"cluster bundle-export demo {K} -o {{tmp}}/export/secrets.yaml", 0,
         out="export fingerprint", err="-o is deprecated here; use -f/--file", then=_exported),
    Case("export-during-rotation", f"cluster bundle-export rotating {K} -f {{tmp}}/r.yaml", 2,
         err="is under way"),
    Case("export-bundle-in-use", f"cluster bundle-export twin {K} -f {{tmp}}/export/twin.yaml", 2,
         err="TalosCluster clusters/twin does not hold its bundle Secret (Ready BundleInUse: the bundle Secret "
             "clusters/demo-bundle is TalosCluster clusters/demo's (created first)"),
    Case("rotate-bundle-in-use", f"cluster rotate twin {K} --wait 0", 2, err="TalosCluster clusters/twin runs no "
         "operation: the bundle Secret clusters/demo-bundle is TalosCluster clusters/demo's"),
    Case("config-apply-bundle-in-use", f"cluster config-apply twin {K} --wait 0", 2,
         err="TalosCluster clusters/twin runs no operation"),
    Case("export-missing", f"cluster bundle-export nope {K} -f {{tmp}}/n.yaml", 2, err="not found"),
    Case("export-unreachable", "cluster bundle-export demo -n clusters --kubeconfig {dead} -f {tmp}/u.yaml", 1,
         err="connection refused"),
    # -- cluster credentials
    Case("credentials-no-rotation", f"cluster credentials demo {K} -d {{tmp}}/creds --wait 2", 2,
         err="no ca-rotation"),
    Case("credentials-bad-wait", f"cluster credentials demo {K} --wait 0", 2, err="--wait must be"),
    Case("credentials-too-early", f"cluster credentials early {K} -d {{tmp}}/creds --wait 1", 1,
         err="TalosOperation clusters/early-rotation is still in Accepting after 1 s"),
    Case("credentials-missing", f"cluster credentials nope {K} -d {{tmp}}/creds --wait 2", 2, err="nope"),
    # -- names: an empty or non-DNS-1123 name is bad input, said in one line, for every command taking one
    Case("status-empty-name", f"cluster status {{empty}} {K}", 2, err="'' is not a Kubernetes object name"),
    Case("status-upper-name", f"cluster status Demo {K}", 2, err="'Demo' is not a Kubernetes object name"),
    Case("status-empty-namespace", "cluster status demo -n {empty} --kubeconfig {kc}", 2,
         err="'' is not a namespace name"),
    Case("rotate-bad-namespace", "cluster rotate demo -n Clusters --kubeconfig {kc} --wait 0", 2,
         err="'Clusters' is not a namespace name"),
    Case("config-apply-bad-name", f"cluster config-apply demo_1 {K} --wait 0", 2, err="'demo_1' is not"),
    Case("export-empty-name", f"cluster bundle-export {{empty}} {K} -f {{tmp}}/e.yaml", 2, err="'' is not"),
    Case("export-bad-secret-namespace", f"cluster bundle-export demo {K} -f {{tmp}}/e.yaml --secret-namespace "
         "a.b", 2, err="'a.b' is not a namespace name"),
    Case("credentials-bad-name", f"cluster credentials demo_x {K} --wait 1", 2, err="argument NAME: 'demo_x'"),
    Case("restore-bundle-bad-name", f"cluster restore-bundle {{empty}} {K}", 2, err="'' is not"),
    Case("etcd-snapshot-bad-name", f"cluster etcd-snapshot demo. {K} -f {{tmp}}/s.db", 2, err="'demo.' is not"),
    Case("rehearse-bad-name", f"cluster rehearse {{empty}} {K} -f {{tmp}}/op.yaml", 2, err="'' is not"),
    Case("status-no-name", f"cluster status {K}", 2, err="the following arguments are required: NAME"),
    # -- a cluster being deleted gets no operation
    Case("rotate-deleting", f"cluster rotate gone {K} --start --wait 0", 2,
         err="TalosCluster clusters/gone is being deleted"),
    Case("config-apply-deleting", f"cluster config-apply gone {K} --wait 0", 2,
         err="TalosCluster clusters/gone is being deleted"),
    # -- a refusal names its way out: a rotation that has not started may be deleted to give way
    Case("config-apply-behind-a-plan", f"cluster config-apply held {K} --wait 0", 2,
         err="delete it (`kubectl -n clusters delete talosoperation held-rotation`; it has not started"),
    # -- files: never over an existing one without --force, never into a missing directory
    Case("generate-missing-dir", "bundle generate -f {tmp}/nodir/x.yaml", 2, err="nodir is not a directory"),
    Case("generate-dir-force", "bundle generate -f {tmp} --force", 2, err="is a directory"),
    Case("generate-force", "bundle generate -f {tmp}/precious.yaml --force", 0, out="wrote {tmp}/precious.yaml"),
    Case("export-over-another-bundle", f"cluster bundle-export demo {K} -f {{tmp}}/precious.yaml", 2,
         err="precious.yaml exists and is not an earlier export of TalosCluster clusters/demo (it holds another "
             "cluster's secrets bundle); it is kept"),
    Case("export-missing-dir", f"cluster bundle-export demo {K} -f {{tmp}}/nodir/x.yaml", 2,
         err="nodir is not a directory; create it first"),
    Case("export-to-a-directory", f"cluster bundle-export demo {K} -f {{tmp}}/foreign", 2, err="is a directory"),
    Case("export-force", f"cluster bundle-export demo {K} -f {{tmp}}/precious.yaml --force", 0,
         out="export fingerprint", then=_forced),
    Case("export-again-same-cluster", f"cluster bundle-export demo {K} -f {{bundle}}", 0, out="export fingerprint"),
    Case("credentials-missing-dir", f"cluster credentials busy {K} -d {{tmp}}/nodir --wait 1", 2,
         err="the directory {tmp}/nodir does not exist"),
    Case("credentials-foreign-files", f"cluster credentials busy {K} -d {{tmp}}/foreign --wait 1", 2,
         err="kubeconfig exists; it is not overwritten"),
    # -- the hand-off says what it waits for, and does not wait for what only a person can do
    Case("credentials-paused", f"cluster credentials held {K} -d {{tmp}}/creds --wait 30", 1,
         err="is paused (spec.paused: true) and goes on only when that is set to false: `kubectl -n clusters "
             "patch talosoperation held-rotation --type merge"),
    Case("credentials-blocked", f"cluster credentials stuck {K} -d {{tmp}}/creds --wait 1", 1,
         err="It is Blocked: preflight: machine stuck-cp-1 (10.0.0.9) does not answer: connection refused"),
    # -- run: settings refused before anything starts
    Case("run-bad-addr", "run --kubeconfig {kc} --metrics-addr nowhere", 2, err="--metrics-addr must be host:port"),
    Case("run-bad-bound", "run --kubeconfig {kc} --max-unavailable 0%", 2, err="--max-unavailable must be"),
    Case("run-no-kubeconfig", "run --kubeconfig {tmp}/none --metrics-addr 127.0.0.1:0", 2, err="does not exist"),
    Case("run-ca-file-alone", "run --ca-file {bundle}", 2, err="--ca-file applies with --kubeconfig only"),
    Case("run-bad-log-level", "run --kubeconfig {kc} --metrics-addr 127.0.0.1:0 --log-level bogus", 2,
         err="'bogus' is not a log level"),
    Case("run-port-out-of-range", "run --kubeconfig {kc} --metrics-addr 127.0.0.1:99999", 2,
         err="a port from 0 to 65535"),
    Case("run-bad-watch-namespace", "run --kubeconfig {kc} --watch-namespace {empty}", 2,
         err="'' is not a namespace name"),
    Case("run-bad-resync", "run --kubeconfig {kc} --metrics-addr 127.0.0.1:0 --resync 0", 2,
         err="--resync must be a positive"),
    # -- the simulators' and the daemon's own files: never over an existing one without --force
    Case("run-port-file-exists", "run --kubeconfig {kc} --metrics-addr 127.0.0.1:0 --port-file {bundle}", 2,
         err="--port-file: {bundle} exists; it is not overwritten: choose a new name, or pass --force to replace it. "
             "Nothing was started."),
    Case("run-port-file-missing-dir", "run --kubeconfig {kc} --metrics-addr 127.0.0.1:0 --port-file "
         "{tmp}/nodir/port", 2, err="nodir is not a directory; create it first"),
    Case("sim-kubeconfig-exists", "sim --api-port 0 --talos-port 0 --kubeconfig {bundle}", 2,
         err="{bundle} exists; it is not overwritten: choose a new name, or pass --force to replace it"),
    Case("sim-kube-kubeconfig-exists", "sim kube --port 0 --kubeconfig {bundle}", 2,
         err="{bundle} exists; it is not overwritten: choose a new name, or pass --force to replace it"),
    Case("sim-kube-kubeconfig-is-a-directory", "sim kube --port 0 --kubeconfig {tmp}/export --force", 2,
         err="export is a directory"),
    Case("sim-kube-port-out-of-range", "sim kube --port 70000 --kubeconfig {tmp}/kc", 2,
         err="70000 is not a port number (0-65535"),
    Case("sim-api-port-not-a-number", "sim --api-port https --kubeconfig {tmp}/kc", 2,
         err="'https' is not a port number"),
    Case("sim-talos-port-negative", "sim talos --port -1", 2, err="-1 is not a port number"),
    # -- demo: refused up front (an even number of control planes cannot rotate)
    Case("demo-even-control-planes", "demo --control-planes 2", 2, err="an odd number of control planes"),
    Case("demo-bad-log-level", "demo --log-level loud", 2, err="'loud' is not a log level"),
]


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and directory under ``root``: its mode and content."""
    return {str(p.relative_to(root)): (p.stat().st_mode, b"" if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_cli_contract(world: World, case: Case) -> None:
    before = await world.inventory()
    files_before = _files(world.tmp)
    world.sim.requests.clear()
    argv = ["" if a == "{empty}" else a for a in world.fill(case.argv).split()]
    rc, out, err = await anyio.to_thread.run_sync(run_cli, argv)
    assert rc == case.rc, (out, err)
    assert world.fill(case.out) in out, out
    assert world.fill(case.err) in err, err
    assert "Traceback" not in err
    if not case.argv.startswith("render"):  # a rendered machine configuration holds its certificates, by design
        assert "BEGIN" not in out + err and "PRIVATE KEY" not in out + err
    if rc != 0:
        assert out == "", "a failed command prints no output"
        # The failure is one `ichord:` line, last (progress notes, like "waiting for ...", may come before it);
        # an argument the parser refuses too (no usage block).
        lines = err.strip().splitlines()
        assert lines[-1].startswith("ichord: ") and len(lines) <= 3, err
        assert sum(line.startswith("ichord: ") for line in lines) == 1, err
        writes = {v: world.sim.requests.count(verb=v) for v in WRITES}
        assert sum(writes.values()) == 0, f"a refusal wrote to the API: {writes}"
        assert await world.inventory() == before
        assert _files(world.tmp) == files_before, "a refusal wrote or changed a file"
    if case.then is not None:
        await case.then(world, out)


def test_the_table_covers_every_command_on_success_and_refusal() -> None:
    """At least 40 cases; every command that takes input has a success and a refusal case."""
    assert len(CASES) >= 40
    for words in ("bundle generate", "render", "cluster status", "cluster config-apply", "cluster rotate",
                  "cluster bundle-export"):
        rcs = {c.rc for c in CASES if c.argv.startswith(words)}
        assert {0, 2} <= rcs, (words, rcs)


async def test_a_taken_metrics_port_is_one_line_and_exit_2(world: World) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await anyio.run_process([sys.executable, "-m", "ichord.cli", "run", "--kubeconfig",
                                        str(world.kubeconfig), "--metrics-addr", f"127.0.0.1:{port}"], check=False)
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode() == (f"ichord: --metrics-addr 127.0.0.1:{port}: the port is already in use (another "
                                    "ichord run?); stop that process or pass another --metrics-addr\n")


async def test_a_config_operation_the_daemon_refuses_is_deleted_again(world: World) -> None:
    """The race the pre-checks cannot close: the daemon refuses the created object (here played by the test);
    the command deletes it by UID and exits 2, leaving nothing behind."""

    async def daemon() -> None:
        while True:
            for op in await world.operations():
                if op["spec"]["clusterRef"]["name"] == "demo" and not op.get("status"):
                    await update_status(crds.operations(world.kube), NS, op["metadata"]["name"], lambda s, _o: {
                        **s, "phase": "Failed", "conditions": [{
                            "type": "ConfigRollout", "status": "False", "reason": "OperationUnfinished",
                            "message": "operation other of the cluster is unfinished",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
                    return
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(daemon)
        rc, out, err = await anyio.to_thread.run_sync(run_cli, world.fill(
            f"cluster config-apply demo {K} --wait 20").split())
    assert rc == 2 and out == "", err
    assert "refused by the daemon (OperationUnfinished)" in err and "was deleted again; nothing is left" in err
    assert [o for o in await world.operations() if o["spec"]["clusterRef"]["name"] == "demo"] == []
