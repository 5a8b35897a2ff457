"""One simulated Talos node: running and staged configuration, boot ID, services, apply and reboot.

Behaviour follows the node's Talos version (Talos's API definitions): v1.14 refuses ApplyConfiguration
mode REBOOT (Unimplemented) and applies AUTO as NO_REBOOT; v1.13 reboots for REBOOT (and for AUTO
when the change needs it) and refuses NO_REBOOT/TRY for a change outside ``CanApplyImmediate``.
Every delay comes from ``Timings`` so tests run in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ichord.contract import V1_14, VersionContract
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.sim.talos.config_view import ConfigInvalidError, ConfigView, read_config
from ichord.sim.talos.decoder import refuse_undecodable
from ichord.sim.talos.etcd import fingerprint as etcd_fingerprint
from ichord.sim.talos.events import EventLog

if TYPE_CHECKING:
    from ichord.sim.talos.cluster import SimCluster

REBOOT, AUTO, NO_REBOOT, STAGED, TRY = 0, 1, 2, 3, 4
MODE_NAMES = {REBOOT: "REBOOT", AUTO: "AUTO", NO_REBOOT: "NO_REBOOT", STAGED: "STAGED", TRY: "TRY"}
CONFIG_TRY_TIMEOUT = 60.0
#: v1alpha1 ``machine.*`` keys <= 1.13 applies without a reboot (Talos's CanApplyImmediate list).
IMMEDIATE_MACHINE_KEYS = frozenset({
    "ca", "acceptedCAs", "certSANs", "install", "network", "time", "sysfs", "sysctls", "logging",
    "controlPlane", "kubelet", "kernel", "registries", "pods", "seccompProfiles", "nodeLabels",
    "nodeAnnotations", "nodeTaints", "features",
})
IMMEDIATE_TOP_KEYS = frozenset({"version", "cluster", "debug", "persist"})



_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(old: list[str], new: list[str], context: int = 3) -> str:
    """difflib's unified diff of ``old`` -> ``new`` ("a/config", "b/config"), matched only between the lines' common
    prefix and suffix (less ``context`` lines each side), its hunk headers' line numbers moved back.

    A stage changes a few certificate lines of a few hundred: matching the whole configuration each dry run was
    a simulated node's largest cost after TLS."""
    shortest = min(len(old), len(new))
    head = 0
    while head < shortest and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < shortest - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    skip, cut = max(0, head - context), max(0, tail - context)
    out = []
    for line in difflib.unified_diff(old[skip:len(old) - cut], new[skip:len(new) - cut], "a/config", "b/config",
                                     lineterm=""):
        m = _HUNK.match(line)
        out.append(line if m is None else
                   f"@@ -{int(m[1]) + skip}{m[2] or ''} +{int(m[3]) + skip}{m[4] or ''} @@" + line[m.end():])
    return "\n".join(out)


@dataclass
class Timings:
    """Simulated durations in seconds (scale them down in tests)."""

    reboot: float = 2.0
    #: Before going down for a reboot the node still answers, in stage REBOOTING (pods and services stopping).
    reboot_shutdown: float = 0.0
    kubelet_restart: float = 1.0
    #: A Kubernetes CA change restarts the kubelet this much later; the Node reads Ready meanwhile (stale Ready).
    kubelet_restart_lag: float = 0.0
    apiserver_restart_delay: float = 3.0
    apiserver_ready_delay: float = 2.0
    apply_duration: float = 0.0
    try_timeout: float | None = None  # overrides the request's try_mode_timeout


@dataclass
class Faults:
    """Per-node fault injection."""

    unreachable: bool = False
    slow: float = 0.0
    refuse_dry_run: bool = False
    reboot_never_happens: bool = False
    etcd_unhealthy: bool = False
    apply_error: str | None = None
    #: The Reboot RPC fails with Internal and this message; nothing reboots (e.g. a sequence already running).
    reboot_error: str | None = None
    #: The next accepted apply takes effect, then the node stops answering before it replies (the connection
    #: drops mid-RPC; the node stays unreachable until ``set_unreachable(False)``).
    vanish_after_apply: bool = False


@dataclass
class ServiceState:
    id: str
    state: str = "Running"
    healthy: bool = True
    events: list[tuple[str, str, float]] = field(default_factory=list)


def needs_reboot_v113(old: MachineConfig, new: MachineConfig) -> list[str]:
    """Paths outside <= 1.13's CanApplyImmediate that differ (v1alpha1 only; other documents apply)."""
    try:
        a, b = old.plain()[old.documents.index(old.v1alpha1)], new.plain()[new.documents.index(new.v1alpha1)]
    except KeyError:
        return []
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "machine":
            ma, mb = a.get(key) or {}, b.get(key) or {}
            out += [f".machine.{k}" for k in sorted(set(ma) | set(mb))
                    if k not in IMMEDIATE_MACHINE_KEYS and ma.get(k) != mb.get(k)]
        elif key not in IMMEDIATE_TOP_KEYS and a.get(key) != b.get(key):
            out.append(f".{key}")
    return out


class SimNode:
    def __init__(self, cluster: SimCluster, name: str, ip: str, port: int, config: MachineConfig,
                 contract: VersionContract, timings: Timings) -> None:
        self.cluster = cluster
        self.name = name
        self.ip = ip
        self.port = port
        self.contract = contract
        self.timings = timings
        self.faults = Faults()
        #: Calls served for this node, by method ("ApplyConfiguration(dry run)" apart): what a client cost it.
        self.rpcs: Counter[str] = Counter()
        self._parsed: tuple[bytes, MachineConfig] | None = None  # (sha256 of the bytes, their parse)
        self.view: ConfigView = read_config(config)
        self.running = config
        self.persistent = config
        self.boot_id = ""
        self.boots = 0
        self.up = False
        self.stage = "MACHINE_STAGE_BOOTING"
        self.services: dict[str, ServiceState] = {}
        self.apiserver_container = ""
        self.apiserver_ready = False
        self.apiserver_restarts = 0
        #: What kube-apiserver loaded for etcd when it last started: the trusted CAs and its client cert's signer.
        self.apiserver_etcd_trust: frozenset[str] = frozenset()
        self.apiserver_etcd_signer = ""
        #: Kubelet restarts decided (a Kubernetes CA change) but not begun yet (``kubelet_restart_lag``).
        self.kubelet_restarts_pending = 0
        #: The running/persistent configurations' encodings, by object (what COSI Get returns; see cosi.py).
        self.encoded: dict[int, tuple[MachineConfig, bytes]] = {}
        self._applying = False
        self._try_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Set by ``end_shutdown``: the shutdown of the reboot under way ends now, not ``Timings.reboot_shutdown``.
        self._shutdown_over = asyncio.Event()
        self._watchers: list[asyncio.Queue[tuple[str, str, str, str]]] = []
        self.resource_versions: dict[tuple[str, str], int] = {}
        #: machined's event stream (MachineService.Events) of the current boot.
        self.events = EventLog()
        self.etcd_leaf_cache: dict[bytes, dict[str, tuple[bytes, bytes]]] = {}

    # ---- identity ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def nodename(self) -> str:
        return self.view.hostname or self.name

    @property
    def is_control_plane(self) -> bool:
        return self.view.is_control_plane

    @property
    def history(self) -> Any:
        return self.cluster.history

    # ---- events for Watch -------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[tuple[str, str, str, str]]:
        q: asyncio.Queue[tuple[str, str, str, str]] = asyncio.Queue()
        self._watchers.append(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[tuple[str, str, str, str]]) -> None:
        if q in self._watchers:
            self._watchers.remove(q)

    def publish(self, event: str, namespace: str, rtype: str, rid: str) -> None:
        """event: CREATED, UPDATED or DESTROYED."""
        key = (rtype, rid)
        self.resource_versions[key] = self.resource_versions.get(key, 0) + 1
        for q in list(self._watchers):
            q.put_nowait((event, namespace, rtype, rid))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- lifecycle --------------------------------------------------------------------------

    def boot(self) -> None:
        """Boot from the configuration on disk: new boot ID, services (re)started, etcd loads its CA."""
        self.running = self.persistent
        self.view = read_config(self.running)
        self.boot_id = str(uuid.uuid4())
        self.boots += 1
        self.events.reset()
        self.events.machine_status("BOOTING", False, [("nodeReady", "node is not ready")])
        names = ["apid", "containerd", "cri", "kubelet", "machined", "udevd"]
        if self.is_control_plane:
            names += ["etcd", "trustd"]
        self.services = {n: ServiceState(n, events=[("Service started as goroutine", "Running", 0.0)])
                         for n in sorted(names)}
        for n in self.services:
            self.publish("CREATED", "runtime", "Services.v1alpha1.talos.dev", n)
        if self.is_control_plane and self.view.etcd_ca is not None:
            self.cluster.etcd.start_member(self.name, self.ip, self.view.etcd_ca.cert_pem,
                                           forced_unhealthy=self.faults.etcd_unhealthy)
            self.apiserver_container = f"containerd://{uuid.uuid4().hex}"
            self.apiserver_ready = True
            self._load_apiserver_etcd()
        self.stage = "MACHINE_STAGE_RUNNING"
        self.events.machine_status("RUNNING", True)
        self.publish("UPDATED", "runtime", "MachineStatuses.runtime.talos.dev", "machine")
        self.history.record("boot", self.name, boot_id=self.boot_id, config_hash=self.running.hash(),
                            cas=self.view.fingerprints())

    def _load_apiserver_etcd(self) -> None:
        ca = self.view.etcd_ca
        certs = ca.certificates if ca is not None else ()
        self.apiserver_etcd_trust = frozenset(etcd_fingerprint(c) for c in certs)
        self.apiserver_etcd_signer = etcd_fingerprint(ca.signer_pem) if ca is not None else ""

    @property
    def apiserver_serving(self) -> bool:
        """kube-apiserver runs, is ready and reaches its node's etcd member (healthy, trusted each way)."""
        etcd = self.cluster.etcd
        return (self.is_control_plane and self.up and self.apiserver_ready
                and etcd.serves_apiserver(self.name, self.apiserver_etcd_trust, self.apiserver_etcd_signer))

    def service_healthy(self, service: str) -> bool:
        """A service's health as Talos reports it; etcd's follows its member (healthy = reaches a majority)."""
        svc = self.services.get(service)
        if svc is None:
            return False
        if service == "etcd":
            return svc.healthy and self.cluster.etcd.healthy(self.name)
        return svc.healthy

    def raise_etcd_alarm(self, alarm: int) -> None:
        """Fault: the local etcd member raises an alarm (1 NOSPACE, 2 CORRUPT)."""
        self.cluster.etcd.raise_alarm(self.name, alarm)

    async def start(self) -> None:
        self.boot()
        await self.cluster.listen(self)
        self.up = True

    async def go_down(self, why: str) -> None:
        self.up = False
        self.events.down()
        for q in list(self._watchers):
            q.put_nowait(("DOWN", "", "", ""))
        await self.cluster.unlisten(self)
        self.history.record("down", self.name, reason=why)

    async def come_up(self) -> None:
        if not self.faults.unreachable:
            await self.cluster.listen(self)
            self.up = True
            self.history.record("up", self.name)

    async def set_unreachable(self, value: bool) -> None:
        self.faults.unreachable = value
        if value and self.up:
            await self.go_down("fault: unreachable")
        elif not value and not self.up and self.stage == "MACHINE_STAGE_RUNNING":
            await self.come_up()

    def set_etcd_unhealthy(self, value: bool) -> None:
        self.faults.etcd_unhealthy = value
        self.cluster.etcd.set_forced_unhealthy(self.name, value)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- reboot -----------------------------------------------------------------------------

    def refuse_reboot(self) -> None:
        """Raise what machined answers when the Reboot RPC fails (``Faults.reboot_error``); the node stays up."""
        if self.faults.reboot_error:
            self.history.record("reboot_refused", self.name, boot_id=self.boot_id, error=self.faults.reboot_error)
            raise GRPCError(Status.INTERNAL, self.faults.reboot_error)

    def request_reboot(self, actor: str) -> None:
        self.history.record("reboot_requested", self.name, actor_id=actor, boot_id=self.boot_id,
                            happens=not self.faults.reboot_never_happens)
        if not self.faults.reboot_never_happens:
            self.events.sequence("reboot", "START", actor)
            self._spawn(self._reboot())

    def end_shutdown(self) -> None:
        """A test's timing hook: the reboot under way stops shutting down now (goes down, then boots as usual), so a
        test holds a node in its shutdown (a long ``Timings.reboot_shutdown``) and lets it go at a chosen moment."""
        self._shutdown_over.set()

    async def _reboot(self) -> None:
        await asyncio.sleep(0)  # let the RPC answer before the node goes away
        self.stage = "MACHINE_STAGE_REBOOTING"
        self.events.machine_status("REBOOTING", False, [("nodeReady", "node is not ready")])
        self.publish("UPDATED", "runtime", "MachineStatuses.runtime.talos.dev", "machine")
        # Shutting down stops the pods and the kubelet first: the Node goes NotReady before the node goes away.
        kubelet = self.services.get("kubelet")
        if kubelet is not None:
            kubelet.state, kubelet.healthy = "Stopping", False
        self.history.record("shutting_down", self.name, boot_id=self.boot_id)
        self._shutdown_over.clear()
        if self.timings.reboot_shutdown:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._shutdown_over.wait(), self.timings.reboot_shutdown)
        old = self.boot_id
        await self.go_down("reboot")
        self.cluster.etcd.stop_member(self.name)
        await asyncio.sleep(self.timings.reboot)
        self.boot()
        self.history.record("reboot", self.name, old_boot_id=old, boot_id=self.boot_id,
                            config_hash=self.running.hash())
        await self.come_up()

    # ---- apply ------------------------------------------------------------------------------

    async def apply(self, data: bytes, mode: int, dry_run: bool, try_timeout: float | None) -> tuple[int, str]:
        """Returns (mode used, mode_details); raises GRPCError like machined does."""
        if self._applying:
            raise GRPCError(Status.FAILED_PRECONDITION, "another apply configuration is already in progress")
        self._applying = True
        try:
            if self.timings.apply_duration:
                await asyncio.sleep(self.timings.apply_duration)
            result = await self._apply(data, mode, dry_run, try_timeout)
        finally:
            self._applying = False
        if self.faults.vanish_after_apply and not dry_run:
            self.faults.vanish_after_apply = False
            self.faults.unreachable = True
            self._spawn(self.go_down("fault: vanished mid-apply"))  # aborts this very RPC's connection
            await asyncio.sleep(5)  # cancelled by the shutdown; never answers
            raise GRPCError(Status.UNAVAILABLE, "connection lost")
        return result

    async def _apply(self, data: bytes, mode: int, dry_run: bool, try_timeout: float | None) -> tuple[int, str]:
        if self.faults.apply_error:
            raise GRPCError(Status.INTERNAL, self.faults.apply_error)
        try:
            cfg = self._parse(data)
        except ConfigParseError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"failed to parse config: {exc}") from None
        refuse_undecodable(cfg, self.contract)
        try:
            cfg.v1alpha1  # noqa: B018 - presence check
        except KeyError:
            raise GRPCError(Status.INVALID_ARGUMENT,
                            "the applied machine configuration doesn't contain v1alpha1 config, "
                            "did you mean to patch the machine config instead?") from None
        try:
            view = read_config(cfg)
        except ConfigInvalidError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
        reason = ""
        if self.contract >= V1_14:
            if mode == REBOOT:
                raise GRPCError(Status.UNIMPLEMENTED,
                                "apply configuration mode REBOOT is not supported: the configuration is applied "
                                "without a reboot (use NO_REBOOT or STAGED and reboot explicitly)")
            if mode == AUTO:
                mode = NO_REBOOT
        else:
            needs = needs_reboot_v113(self.running, cfg)
            # CanApplyImmediate's error (the real one carries a Go struct diff; the paths stand in for it).
            refusal = "this config change can't be applied in immediate mode\ndiff: " + ", ".join(needs)
            if mode == AUTO:
                mode, reason = (REBOOT, refusal) if needs else (NO_REBOOT, "")
            elif mode in (NO_REBOOT, TRY) and needs:
                raise GRPCError(Status.INVALID_ARGUMENT, refusal)
        if mode not in MODE_NAMES:
            raise GRPCError(Status.INVALID_ARGUMENT, f"unknown apply mode {mode}")
        details = {
            NO_REBOOT: "Applied configuration without a reboot",
            STAGED: "Staged configuration to be applied after the next reboot",
            TRY: "Applied configuration without a reboot",
            REBOOT: "Applied configuration with a reboot",
        }[mode]
        if dry_run:
            if self.faults.refuse_dry_run:
                raise GRPCError(Status.INTERNAL, "dry run failed (injected fault)")
            return mode, self._dry_run_summary(cfg, details, data)
        timeout = self.timings.try_timeout or try_timeout or CONFIG_TRY_TIMEOUT
        if mode == TRY:
            details += f"\nThe config is applied in 'try' mode and will be automatically reverted back in {timeout:g}s"
        details += f": {reason}" if reason else ""
        self.history.record("apply", self.name, mode=MODE_NAMES[mode], config_hash=cfg.hash(),
                            previous_hash=self.running.hash(), boot_id=self.boot_id)
        if mode == STAGED:
            self._persist(cfg)
        elif mode == NO_REBOOT:
            self._cancel_try()
            self._persist(cfg)
            self.set_running(cfg, view)
        elif mode == TRY:
            self._cancel_try()
            previous = self.running
            self.set_running(cfg, view)
            self._try_task = self._spawn(self._rollback(previous, timeout))
        else:  # REBOOT, v1.13 only
            self._persist(cfg)
            self.request_reboot(f"apply-{uuid.uuid4()}")
        return mode, details

    def _parse(self, data: bytes) -> MachineConfig:
        """A dry run and the apply that follows it send the same bytes: the last parse is kept (a copy is handed
        out, since the node keeps and changes what it runs). machined's Go parser costs next to nothing; ruamel's
        cost would otherwise make the simulator, not the client, the bottleneck of a wide pass."""
        digest = hashlib.sha256(data).digest()
        if self._parsed is None or self._parsed[0] != digest:
            self._parsed = (digest, MachineConfig.parse_values(data))
        return self._parsed[1].copy()

    def wire_of(self, cfg: MachineConfig) -> bytes:
        """``cfg``'s wire encoding, kept while ``cfg`` is the running or persistent configuration (both change only
        on an apply or a reboot, and every COSI Get and dry run of the node reads one of them)."""
        cached = self.encoded.get(id(cfg))
        if cached is None or cached[0] is not cfg:
            cached = (cfg, cfg.wire_bytes())
            live = {id(c): self.encoded[id(c)] for c in (self.running, self.persistent)
                    if id(c) in self.encoded and self.encoded[id(c)][0] is c}
            self.encoded = {**live, id(cfg): cached}
        return cached[1]

    def _dry_run_summary(self, cfg: MachineConfig, details: str, data: bytes) -> str:
        if self.running.plain() == cfg.plain():  # the diff is empty: no YAML to write out
            diff = "No changes."
        else:
            # libyaml's text (render/wire.py) rather than ruamel's: the same values at a tenth of the cost; the new
            # side is the text received (its values are cfg's; Talos diffs its own re-encoding, the sim need not).
            old, new = self.wire_of(self.running).decode().splitlines(), data.decode(errors="replace").splitlines()
            diff = unified_diff(old, new) or "No changes."
        return f"Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{diff}"

    def _persist(self, cfg: MachineConfig) -> None:
        self.persistent = cfg
        self.publish("UPDATED", "config", "MachineConfigs.config.talos.dev", "persistent")

    def _cancel_try(self) -> None:
        if self._try_task is not None and not self._try_task.done():
            self._try_task.cancel()
        self._try_task = None

    async def _rollback(self, previous: MachineConfig, after: float) -> None:
        await asyncio.sleep(after)
        self.history.record("try_rollback", self.name, config_hash=previous.hash())
        self.set_running(previous, read_config(previous))

    def set_running(self, cfg: MachineConfig, view: ConfigView) -> None:
        """Make ``cfg`` the running configuration and react like Talos's controllers do."""
        old = self.view
        self.running, self.view = cfg, view
        self.publish("UPDATED", "config", "MachineConfigs.config.talos.dev", "v1alpha1")
        self.history.record("running_config", self.name, config_hash=cfg.hash(), cas=view.fingerprints())
        if old.kubelet_inputs != view.kubelet_inputs and "kubelet" in self.services:
            self._spawn(self._restart_kubelet("Kubernetes CA changed", lag=self.timings.kubelet_restart_lag))
        if view.is_control_plane and old.apiserver_inputs != view.apiserver_inputs:
            self._spawn(self._restart_apiserver())
        if (old.etcd_ca.cert_pem if old.etcd_ca else None) != (view.etcd_ca.cert_pem if view.etcd_ca else None):
            # etcd reads its CA only when it starts; Talos does not restart it.
            self.history.record("etcd_reboot_required", self.name)

    async def _restart_kubelet(self, why: str, lag: float = 0.0) -> None:
        if lag > 0:
            self.kubelet_restarts_pending += 1
            self.history.record("kubelet_restart_scheduled", self.name, reason=why, after=lag)
            try:
                await asyncio.sleep(lag)
            finally:
                self.kubelet_restarts_pending -= 1
        svc = self.services["kubelet"]
        svc.state, svc.healthy = "Stopping", False
        self.history.record("kubelet_restart", self.name, reason=why)
        self.publish("DESTROYED", "runtime", "Services.v1alpha1.talos.dev", "kubelet")
        await asyncio.sleep(self.timings.kubelet_restart)
        svc.state, svc.healthy = "Running", True
        self.publish("CREATED", "runtime", "Services.v1alpha1.talos.dev", "kubelet")
        self.history.record("kubelet_running", self.name)

    async def _restart_apiserver(self) -> None:
        await asyncio.sleep(self.timings.apiserver_restart_delay)
        old = self.apiserver_container
        self.apiserver_container = f"containerd://{uuid.uuid4().hex}"
        self.apiserver_ready = False
        self.apiserver_restarts += 1
        self._load_apiserver_etcd()
        pod = f"kube-system/kube-apiserver-{self.nodename}"
        self.publish("UPDATED", "k8s", "StaticPodStatuses.kubernetes.talos.dev", pod)
        self.history.record("apiserver_restart", self.name, old_container=old, container=self.apiserver_container)
        await asyncio.sleep(self.timings.apiserver_ready_delay)
        self.apiserver_ready = True
        self.publish("UPDATED", "k8s", "StaticPodStatuses.kubernetes.talos.dev", pod)
        self.history.record("apiserver_ready", self.name, container=self.apiserver_container)

    def restart_service(self, service: str) -> None:
        if service != "kubelet":
            # Only kubelet and extension services restart through the API (Talos's ServiceRestart).
            raise GRPCError(Status.UNKNOWN, f'service "{service}" doesn\'t support restart operation via API')
        self._spawn(self._restart_kubelet("ServiceRestart"))

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name, "endpoint": self.endpoint, "type": self.view.machine_type, "up": self.up,
            "version": str(self.contract), "boot_id": self.boot_id, "boots": self.boots, "stage": self.stage,
            "running_hash": self.running.hash(), "persistent_hash": self.persistent.hash(),
            "cas": self.view.fingerprints(),
            "services": {k: {"state": v.state, "healthy": v.healthy} for k, v in self.services.items()},
            "apiserver": {"container": self.apiserver_container, "ready": self.apiserver_ready,
                          "restarts": self.apiserver_restarts} if self.is_control_plane else None,
            "faults": {k: v for k, v in vars(self.faults).items()},
        }

