"""``ichord demo``'s CA rotation: a default ca-rotation TalosOperation, followed stage by stage.

The demo plays the operator for the hand-off and, at the end, reads the truth from the simulator
(each node's running CAs, the managed API server's serving CA, the bundle Secret in the store), not
from ichord's status: the summary shows independently what the rotation changed. Watching is done
from inside the simulators (store listeners, the Talos history), so it costs no API request.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.operations.ca_rotation.clients import available
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint, certificate_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.render.generate import render
from ichord.settings import Timing

if TYPE_CHECKING:
    from ichord.demo.observe import Observer
    from ichord.kube.client import KubeClient
    from ichord.sim.combined import SimEnvironment
    from ichord.sim.kube.events import Change
    from ichord.sim.kube.resources import ResourceType

OPERATION = "demo-ca-rotation"
TARGETS = ("talos", "kubernetes")
#: The in-cluster clients the rotation restarts (Talos's default CNI, flannel): the simulated cluster has them.
CLIENTS = (("daemonsets", "kube-flannel"), ("daemonsets", "kube-proxy"), ("deployments", "coredns"))
STAGES = tuple(s.value for s in Stage)
WHAT = {
    "Accepting": "every node trusts the new CAs too, still signs with the old",
    Stage.AWAITING_CREDENTIALS.value: "the operator takes a talosconfig and a kubeconfig from the new CAs",
    "Issuing": "every node signs with the new CAs, still trusts the old; then kube-root-ca.crt and the clients "
               "settle",
    "Dropping": "every node trusts only the new CAs; then the one update of the bundle Secret",
    "Finalizing": "the replaced bundle verified, the Nodes settle, the clients restart one at a time",
    "Done": "",
}
SHORT = 16  # hex digits of a fingerprint shown (the simulator's own state uses 16 as well)

Say = Callable[[str], None]


class RotationFailed(Exception):
    """The rotation did not do what the demo shows; the message says what was seen instead."""


def short(fp: str | None) -> str:
    return (fp or "")[:SHORT]


def _fp(pem: bytes) -> str:
    return certificate_fingerprint(pem)[:SHORT]


def ensure_clients(env: SimEnvironment) -> None:
    """The kube-system workloads a rotation restarts, unless the simulated cluster already has them."""
    store = env.kube.store
    for plural, name in CLIENTS:
        rt = store.resolve("apps", "v1", plural)
        if any(o["metadata"]["name"] == name for o in store.list(rt, "kube-system")[0]):
            continue
        kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
        spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}},
                                "template": {"metadata": {"labels": {"app": name}},
                                             "spec": {"containers": [{"name": name, "image": f"{name}:1"}]}}}
        store.create(rt, "kube-system", {"apiVersion": "apps/v1", "kind": kind,
                                         "metadata": {"name": name, "namespace": "kube-system"}, "spec": spec})


@dataclass
class Watch:
    """What the rotation does, as the stores and the Talos history show it."""

    env: SimEnvironment
    say: Say
    on_stage: Callable[[str], None]
    old: dict[str, str]  # target -> previous fingerprint (short)
    new: dict[str, str] = field(default_factory=dict)  # target -> next fingerprint (short), once status shows it
    stage: str = ""
    stages: list[str] = field(default_factory=list)
    phase: str = ""
    condition: tuple[str, str, str] = ("", "", "")  # CARotation status, reason, message
    op: dict[str, Any] = field(default_factory=dict)
    applies: dict[str, Counter[str]] = field(default_factory=dict)  # machine -> stage -> applies
    kubelet_restarts: Counter[str] = field(default_factory=Counter)
    apiserver_restarts: Counter[str] = field(default_factory=Counter)
    restarted: list[str] = field(default_factory=list)
    back: list[str] = field(default_factory=list)
    stale: tuple[str, str, str] = ("", "", "")  # BundleBackupStale status, reason, message
    root_ca_new: bool = False
    serving: str = ""
    changed: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self._machine = {self.env.node(m).name: m for m in self.env.machine_names}
        self.applies = {m: Counter() for m in self.env.machine_names}
        self.serving = _fp(self.env.kube.ca_pem)

    def label(self, fp: str | None, target: str) -> str:
        """``new``/``old`` for the rotation's CAs of ``target``, else the fingerprint itself."""
        fp = short(fp)
        return "new" if fp and fp == self.new.get(target) else "old" if fp == self.old.get(target) else fp or "-"

    # ---- listeners --------------------------------------------------------------------------

    def attach(self) -> None:
        self.env.management.store.listeners.append(self._on_management)
        self.env.kube.store.listeners.append(self._on_managed)
        self.env.talos.history.listeners.append(self._on_event)

    def detach(self) -> None:
        for store, fn in ((self.env.management.store, self._on_management), (self.env.kube.store, self._on_managed)):
            if fn in store.listeners:
                store.listeners.remove(fn)
        if self._on_event in self.env.talos.history.listeners:
            self.env.talos.history.listeners.remove(self._on_event)

    def _on_management(self, change: Change, rt: ResourceType) -> None:
        if change.namespace != self.env.namespace:
            return
        name = change.new["metadata"]["name"]
        if rt.plural == "talosoperations" and name == OPERATION:
            self._operation(change.new)
        elif rt.plural == "talosclusters" and name == self.env.cluster_name:
            cond = find((change.new.get("status") or {}).get("conditions"), names.BUNDLE_BACKUP_STALE)
            seen = (str(cond["status"]), str(cond["reason"]), str(cond.get("message", ""))) if cond else ("", "", "")
            if seen != self.stale and self.stages:
                self.say(f"  cluster: {names.BUNDLE_BACKUP_STALE}={seen[0]}/{seen[1]}: {seen[2]}")
            self.stale = seen
        self.changed.set()

    def _operation(self, op: dict[str, Any]) -> None:
        self.op = op
        status = op.get("status") or {}
        ca = status.get("caRotation") or {}
        for cert in ca.get("certificates") or []:
            if cert.get("next"):
                self.new[str(cert["name"])] = short(str(cert["next"]))
        stage = str(ca.get("stage") or "")
        if stage and stage != self.stage:
            self.stage = stage
            self.stages.append(stage)
            self.on_stage(stage)
            cas = ", ".join(f"{t} {self.old.get(t, '?')} -> {self.new.get(t, '?')}" for t in TARGETS) \
                if stage == "Accepting" else ""
            what = "; ".join(x for x in (WHAT.get(stage, ""), cas) if x)
            self.say(f"rotation: stage {stage}" + (f": {what}" if what else ""))
        cond = find(status.get("conditions"), names.CA_ROTATION)
        seen = (str(cond["status"]), str(cond["reason"]), str(cond.get("message", ""))) if cond else ("", "", "")
        if seen != self.condition and cond is not None:
            self.say(f"  {names.CA_ROTATION}={seen[0]}/{seen[1]}: {seen[2]}")
        self.condition = seen
        self.phase = str(status.get("phase") or "")

    def _on_managed(self, change: Change, rt: ResourceType) -> None:
        obj = change.new
        if rt.plural in ("daemonsets", "deployments") and change.namespace == "kube-system":
            uid = (self.op.get("metadata") or {}).get("uid")
            tpl = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
            what = f"{rt.plural.removesuffix('s')}/{obj['metadata']['name']}"
            if uid and (tpl.get("annotations") or {}).get(names.CA_ROTATION_TEMPLATE_ANNOTATION) == uid:
                if what not in self.restarted:
                    self.restarted.append(what)
                    self.say(f"  client restart: {what} (rollout restart of its pods, so they load the new CA)")
                elif what not in self.back and available(obj):
                    self.back.append(what)
                    self.say(f"  client restart: {what} available again")
        elif rt.plural == "configmaps" and obj["metadata"]["name"] == names.ROOT_CA_CONFIGMAP and not self.root_ca_new:
            self._root_ca()
        elif rt.plural != "configmaps":
            return
        self.changed.set()

    def _root_ca(self) -> None:
        new = self.new.get("kubernetes")
        if not new:
            return
        store = self.env.kube.store
        maps = store.list(store.resolve("", "v1", "configmaps"), None,
                          lambda o: o["metadata"]["name"] == names.ROOT_CA_CONFIGMAP)[0]
        holding = [m for m in maps if new in {_fp(b) for b in _pem.pem_blocks(
            str((m.get("data") or {}).get("ca.crt", "")).encode())}]
        if maps and len(holding) == len(maps):
            self.root_ca_new = True
            self.say(f"  {names.ROOT_CA_CONFIGMAP} holds the new kubernetes CA in all {len(maps)} namespaces")

    def _on_event(self, event: dict[str, Any]) -> None:
        machine = self._machine.get(str(event.get("node")))
        if machine is None:
            return
        kind = event.get("kind")
        if kind == "apply":
            self.applies[machine][self.stage or "start"] += 1
        elif kind == "kubelet_restart":
            self.kubelet_restarts[machine] += 1
        elif kind == "apiserver_restart":
            self.apiserver_restarts[machine] += 1
            self.say(f"  {machine} kube-apiserver restarted (it loads the CAs of its new configuration)")
        self.changed.set()

    async def follow_serving_ca(self) -> None:
        """The managed API server's serving CA switches when a restarted kube-apiserver signs with another."""
        while True:
            fp = _fp(self.env.kube.ca_pem)
            if fp != self.serving:
                self.serving = fp
                self.say(f"  the managed Kubernetes API now serves with the {self.label(fp, 'kubernetes')} "
                         f"kubernetes CA {fp}")
            await anyio.sleep(0.05)


# ---- the operator's hand-off ----------------------------------------------------------------


@dataclass
class Credentials:
    paths: list[Path]
    how: str


async def hand_off(kube: KubeClient, env: SimEnvironment, out_dir: Path, wait: float, say: Say) -> Credentials:
    """Play the operator: ``ichord cluster credentials --acknowledge``'s hand-off, into the demo's directory."""
    from ichord.credentials import hand_off as credentials_hand_off  # noqa: PLC0415 - only the demo's rotation

    done = await credentials_hand_off(kube, env.namespace, env.cluster_name, out_dir, wait=wait, say=say)
    how = (f"minted from the new CAs in {done.stage}, proven against the cluster, acknowledged with the token "
           f"(client certificates {short(done.talos_client_fingerprint)} talos, "
           f"{short(done.kube_client_fingerprint)} kubernetes)")
    return Credentials([Path(done.talosconfig), Path(done.kubeconfig)], how)


# ---- following it ---------------------------------------------------------------------------


def stage_bound(stage: str, timeout: float, timing: Timing) -> float:
    """How long a stage may take: the step timeout plus the waits the stage schedules on purpose."""
    planned = {"Issuing": timing.ca_client_settle_delay,
               "Finalizing": timing.ca_kubelet_settle_delay + timing.ca_client_restart_timeout}.get(stage, 0.0)
    return timeout + planned


async def create(kube: KubeClient, env: SimEnvironment) -> None:
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": OPERATION}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})


async def follow(watch: Watch, step_timeout: float, timing: Timing,
                 on_awaiting: Callable[[], Awaitable[None]]) -> None:
    """Wait, each stage bounded, until the operation is Completed; RotationFailed otherwise."""
    handed = False
    while watch.phase not in ("Completed", "Failed"):
        stage = watch.stage
        bound = stage_bound(stage, step_timeout, timing)
        with anyio.move_on_after(bound) as scope:
            while watch.stage == stage and watch.phase not in ("Completed", "Failed"):
                if stage == Stage.AWAITING_CREDENTIALS.value and not handed:
                    handed = True
                    await on_awaiting()
                    continue
                watch.changed = anyio.Event()
                await watch.changed.wait()
        if scope.cancelled_caught:
            _status, reason, message = watch.condition
            raise RotationFailed(f"the rotation stayed in {stage or 'its start'} for {bound:g} s; "
                                 f"{names.CA_ROTATION} says {reason or 'nothing'}: {message or '-'}")
    if watch.phase == "Failed":
        raise RotationFailed(f"the rotation failed: {watch.condition[1]}: {watch.condition[2]}")


def live_bundle(env: SimEnvironment) -> tuple[SecretsBundle, set[str]]:
    """The bundle Secret as stored now, and the keys it holds."""
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)


def old_fingerprints(bundle: SecretsBundle) -> dict[str, str]:
    return {"talos": short(ca_fingerprint(bundle.os)), "kubernetes": short(ca_fingerprint(bundle.k8s))}


# ---- the step, and the truth at its end -----------------------------------------------------


class RotationDemo:
    """Create the rotation, follow it, hand off, then check and show the simulator's truth."""

    def __init__(self, env: SimEnvironment, client: KubeClient, obs: Observer, say: Say, *, timeout: float,
                 timing: Timing, out_dir: Path) -> None:
        self.env = env
        self.client = client
        self.obs = obs
        self.say = say
        self.timeout = timeout
        self.timing = timing
        self.out_dir = out_dir
        assert env.bundle is not None
        self.watch = Watch(env, say, self._on_stage, old_fingerprints(env.bundle))
        self.credentials: Credentials | None = None
        self.elapsed = 0.0

    def _on_stage(self, stage: str) -> None:
        self.obs.stage = stage  # the per-machine apply lines name the stage they happened in

    async def run(self, patches: list[str]) -> None:
        ensure_clients(self.env)
        self.watch.attach()
        t0 = anyio.current_time()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.watch.follow_serving_ca)
                await create(self.client, self.env)
                await follow(self.watch, self.timeout, self.timing, self._hand_off)
                tg.cancel_scope.cancel()
        finally:
            self.watch.detach()
            self.obs.stage = ""
            self.elapsed = anyio.current_time() - t0
        _status, reason, message = self.watch.condition
        if reason != names.CARotationReason.ROTATED:
            raise RotationFailed(f"the rotation completed with {names.CA_ROTATION} reason {reason}, not Rotated: "
                                 f"{message}")
        # ichord's own machine reconciler agrees afterwards: every machine Converged, nothing more applied.
        new, _keys = live_bundle(self.env)
        cluster = replace(self.env.cluster_inputs(), patches=tuple(patches))
        want = {m: render(new, cluster, self.env.machine_inputs(m)).hash() for m in self.env.machine_names}
        counts = {r.name: len(r.applies) for r in self.obs.rows.values()}
        await self.obs.until(lambda r: r.reason == names.ReadyReason.CONVERGED and r.config_hash == want[r.name],
                             self.timeout,
                             "every machine Converged on the rotated bundle's render")
        again = [r.name for r in self.obs.rows.values() if len(r.applies) != counts[r.name]]
        if again:
            raise RotationFailed(f"after the rotation the machine reconciler applied again to {', '.join(again)}")

    async def _hand_off(self) -> None:
        self.say("operator: the rotation waits for the operator's hand-off; the demo plays the operator")
        try:
            self.credentials = await hand_off(self.client, self.env, self.out_dir, self.timeout,
                                              lambda text: self.say(f"  operator: {text}"))
        except Exception as exc:  # the hand-off's own errors say what failed; the demo names the step
            raise RotationFailed(f"the operator's hand-off failed: {type(exc).__name__}: "
                                 f"{SCRUBBER.text(str(exc))[:300]}") from None
        for path in self.credentials.paths:
            self.say(f"  operator: wrote {path} (from the new CAs; its content is never printed)")

    def summary(self) -> tuple[list[str], list[str]]:
        """What changed, read from the simulator, and what differs from a finished rotation (none: exit 0)."""
        w, env, problems = self.watch, self.env, []
        lines = ["CA rotation, as the simulated cluster shows it (not ichord's status):"]
        for t in TARGETS:
            lines.append(f"  {t + ' CA':<14} old {w.old.get(t, '?')} -> new {w.new.get(t, '?')}")
        lines.append(f"  {'MACHINE':<16} {'TALOS signs/trusts':<20} {'KUBERNETES signs/trusts':<25} "
                     "APPLIES (Accepting/Issuing/Dropping)  RESTARTS (kubelet/apiserver)")
        for plan in env.machines:
            m, f = plan.name, env.node(plan.name).view.fingerprints()
            os_signs, os_trusts = w.label(f["os"]["issuing"], "talos"), [w.label(x, "talos")
                                                                          for x in f["os"]["trusted"]]
            k8s = f["kubernetes"]
            k_signs = w.label(k8s["issuing"], "kubernetes")
            k_trusts = sorted({w.label(x, "kubernetes") for x in [k8s["issuing"], *k8s["trusted"]] if x})
            # A worker's configuration names the Kubernetes CA without its key: it trusts it, signs nothing.
            signs_ok = k_signs == "new" or (plan.role != "controlplane" and k_signs == "-")
            if (os_signs, os_trusts, k_trusts) != ("new", ["new"], ["new"]) or not signs_ok:
                problems.append(f"{m} signs talos {os_signs} trusting {'+'.join(os_trusts)}, kubernetes {k_signs} "
                                f"trusting {'+'.join(k_trusts)}: not only the new CAs")
            a = w.applies[m]
            applies = "/".join(str(a[s]) for s in ("Accepting", "Issuing", "Dropping"))
            lines.append(f"  {m:<16} {os_signs + ' / ' + '+'.join(os_trusts):<20} "
                         f"{k_signs + ' / ' + '+'.join(k_trusts):<25} {applies:<36} "
                         f"{w.kubelet_restarts[m]}/{w.apiserver_restarts[m]}")
        serving = w.label(_fp(env.kube.ca_pem), "kubernetes")
        clients = "+".join(w.label(_fp(c), "kubernetes") for c in env.kube.client_auth.cas) \
            if env.kube.client_auth is not None else "-"
        lines.append(f"  managed Kubernetes API: serves with the {serving} kubernetes CA, accepts client "
                     f"certificates from the {clients} one(s)")
        if serving != "new":
            problems.append(f"the managed Kubernetes API still serves with the {serving} kubernetes CA")
        bundle, keys = live_bundle(env)
        held = {"talos": w.label(ca_fingerprint(bundle.os), "talos"),
                "kubernetes": w.label(ca_fingerprint(bundle.k8s), "kubernetes")}
        rest = "still holds rotation.yaml" if names.ROTATION_KEY in keys else "rotation.yaml removed"
        lines.append(f"  bundle Secret {env.namespace}/{env.secret_name}: talos {held['talos']}, kubernetes "
                     f"{held['kubernetes']}, {rest} (keys never printed)")
        if set(held.values()) != {"new"} or names.ROTATION_KEY in keys:
            problems.append(f"the bundle Secret holds talos {held['talos']}, kubernetes {held['kubernetes']} ({rest})")
        status, reason, message = w.stale
        lines.append(f"  TalosCluster {env.cluster_name}: {names.BUNDLE_BACKUP_STALE}={status or '-'}/{reason or '-'}: "
                     f"{message or '-'}")
        if status != "True":
            problems.append(f"{names.BUNDLE_BACKUP_STALE} was not raised on the TalosCluster")
        lines.append(f"  clients restarted one at a time: {', '.join(w.restarted) or 'none'}"
                     f"; available again: {len(w.back)}/{len(w.restarted)}")
        if self.credentials is not None:
            lines.append(f"  operator hand-off: {self.credentials.how}")
            lines += [f"    {p}" for p in self.credentials.paths]
        lines.append(f"  stages seen: {' -> '.join(w.stages)}; {names.CA_ROTATION}={w.condition[0]}/{w.condition[1]} "
                     f"in {self.elapsed:.1f}s")
        return lines, problems
