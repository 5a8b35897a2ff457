"""The demo itself: the simulators and the daemon in one event loop, the steps, the summary."""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import anyio

from ichord.api.names import ReadyReason
from ichord.contract import VersionContract
from ichord.demo.observe import DemoFailed, Observer, _expect_applies
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import bundle_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.render.generate import render
from ichord.settings import Timing

if TYPE_CHECKING:
    from ichord.daemon import Daemon
    from ichord.demo.rotation import RotationDemo
    from ichord.demo.view import View
    from ichord.kube.client import KubeClient
    from ichord.sim.combined import SimEnvironment

SAFE_PATCH = 'machine:\n  sysctls:\n    net.core.somaxconn: "65535"\n'
REBOOT_PATCH = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"
#: Talos 1.13 has no KernelModuleConfig document (its decoder refuses the kind): the v1alpha1 field instead.
REBOOT_PATCH_V1_13 = "machine:\n  kernel:\n    modules:\n      - name: br_netfilter\n"


class Demo:
    """Start the simulators and the daemon, run the steps ``--only`` asks for, then show the summary."""

    def __init__(self, args: argparse.Namespace, contract: VersionContract, bundle: SecretsBundle | None,
                 log_path: Path, view: View) -> None:
        self.args = args
        self.contract = contract
        self.bundle = bundle
        self.log_path = log_path
        self.view = view
        self.timing = Timing().scaled(args.time_scale)
        self.rotation: RotationDemo | None = None
        self._stopping = False

    def step(self, n: str, text: str) -> None:
        self.view.say(f"{self.view.stamp()} {n} {text}")

    def ok(self, text: str) -> None:
        self.view.say(f"{self.view.stamp()}   ok: {text}")

    async def main(self) -> int:
        from ichord.sim.combined import SimEnvironment  # noqa: PLC0415 - keeps `ichord --help` light

        a = self.args
        self.view.say(f"ichord demo: {a.control_planes} control plane(s) + {a.workers} worker(s), Talos "
                      f"{self.contract}, every duration x{a.time_scale:g}")
        # ichord's objects on a management API of their own: the managed API server switches its serving CA
        # mid-rotation, and following that in-process needs the trust pool's base CA file (a pod's ca.crt).
        env = SimEnvironment(control_planes=a.control_planes, workers=a.workers, contract=self.contract,
                             bundle=self.bundle, time_scale=a.time_scale, management_api="separate")
        try:
            with anyio.fail_after(a.timeout):
                await env.start()
            return await self._with_env(env)
        except TimeoutError:
            return self._failed(f"the simulators did not start within {a.timeout:g} s")
        finally:
            with anyio.CancelScope(shield=True):
                await env.stop()
            self.view.close()

    async def _with_env(self, env: SimEnvironment) -> int:
        from ichord.daemon import Daemon, DaemonSettings, make_client  # noqa: PLC0415
        from ichord.demo.rotation import RotationFailed  # noqa: PLC0415

        bundle = env.bundle
        assert bundle is not None  # start() generated one when none was given
        self.view.say(f"bundle: fingerprint {bundle_fingerprint(bundle)[:16]}, in the Secret "
                      f"{env.namespace}/{env.secret_name} (its keys are never printed)")
        ips = [m.ip for m in env.machines]
        self.view.say(f"simulators up in {env.started_in:.2f}s: the cluster's Kubernetes API {env.kube.url}, Talos "
                      f"apid on {ips[0]}..{ips[-1]}; ichord's objects on a management API {env.management.url}: "
                      f"TalosCluster {env.cluster_name} + {len(ips)} TalosMachines in {env.namespace}")
        initial = _rendered(env, bundle, [])
        by_role = {m.role: initial[m.name][:12] for m in env.machines}
        self.view.say("each node runs ichord's render of those objects: "
                      + ", ".join(f"{role} config {h}" for role, h in by_role.items()))
        self.view.say(f"daemon: `ichord run` in this process, log ({self.args.log_level}, JSON) in {self.log_path}")
        observer = Observer(env, self.view)
        for row in observer.rows.values():
            row.running = initial[row.name]
        self.view.rows = list(observer.rows.values())
        settings = DaemonSettings(kubeconfig=str(env.kubeconfig), namespace=env.namespace, identity="ichord-demo",
                                  metrics_host="127.0.0.1", metrics_port=0, timing=self.timing)
        failure: list[str] = []
        before = Counter(env.management.requests.counts())
        managed_before = Counter(env.kube.requests.counts())
        t0 = time.monotonic()
        with self.log_path.open("a", encoding="utf-8") as log_file:
            _log_to(log_file, self.args.log_level)
            observer.attach()
            kube = client = None
            try:
                kube = await make_client(settings)
                client = await make_client(replace(settings, timing=Timing()))  # the demo's own: unscaled
                async with anyio.create_task_group() as tg:
                    script = anyio.CancelScope()
                    tg.start_soon(self._run_daemon, Daemon(settings, kube), failure, script)
                    tg.start_soon(self._refresh)
                    with script:
                        try:
                            await self._script(env, bundle, observer, client, initial)
                        # except*: a step's own task group (the rotation's) raises its failure in a group.
                        except* (DemoFailed, RotationFailed) as group:
                            failure.append(str(_first(group)))
                        except* IchordError as group:  # the demo's own request to the API server failed
                            failure.append(f"a request of the demo's own failed: {SCRUBBER.text(str(_first(group)))}")
                    requests = Counter(env.management.requests.counts()) - before
                    managed = Counter(env.kube.requests.counts()) - managed_before
                    watches = int(env.management.open_watches)
                    elapsed = time.monotonic() - t0
                    self._stopping = True
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    for c in (client, kube):
                        if c is not None:
                            await c.close()
                observer.detach()
                logging.getLogger().handlers.clear()
        self.view.freeze()
        if failure:
            return self._failed(failure[0])
        return self._summary(observer, requests, managed, watches, elapsed)

    async def _run_daemon(self, daemon: Daemon, failure: list[str], script: anyio.CancelScope) -> None:
        try:
            await daemon.run()
            if not self._stopping:
                failure.append("interrupted: the daemon stopped on SIGINT or SIGTERM before the demo finished")
        except Exception as exc:
            logging.getLogger("ichord.demo").exception("the daemon crashed")
            while isinstance(exc, ExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]  # the task group's wrapping says nothing: name what was raised
            failure.append(f"the daemon stopped on {type(exc).__name__}: {SCRUBBER.text(str(exc))[:300]} (the log "
                           "has the traceback; a busy machine may need a larger --time-scale)")
        finally:
            script.cancel()

    async def _refresh(self) -> None:
        while True:
            self.view.refresh()
            await anyio.sleep(0.1)

    async def _script(self, env: SimEnvironment, bundle: SecretsBundle, obs: Observer, client: KubeClient,
                      initial: dict[str, str]) -> None:
        t, n, only = self.args.timeout, len(obs.rows), self.args.only
        total = 1 + (3 if only != "rotation" else 0) + (1 if only != "config" else 0)
        number = iter(f"{i}/{total}" for i in range(1, total + 1))
        self.step(next(number), "converge: the daemon reads every node's running configuration and compares it with "
                  "its render")
        await obs.until(lambda r: r.reason == ReadyReason.CONVERGED and r.config_hash == initial[r.name], t,
                        "every machine Ready=True/Converged")
        _expect_applies(obs, lambda _r: [], "before any change")
        self.ok(f"{n}/{n} machines Ready=True/Converged, nothing applied (the nodes already run the render)")
        patches: list[str] = []
        if only != "rotation":
            await self._config_steps(env, bundle, obs, client, number)
            patches = [SAFE_PATCH]
        if only != "config":
            await self._rotation_step(env, obs, client, patches, next(number))

    async def _config_steps(self, env: SimEnvironment, bundle: SecretsBundle, obs: Observer, client: KubeClient,
                            number: Iterator[str]) -> None:
        t, n = self.args.timeout, len(obs.rows)
        safe = _rendered(env, bundle, [SAFE_PATCH])
        self.step(next(number), "safe patch on the TalosCluster: machine.sysctls net.core.somaxconn=65535")
        await _patch(client, env, [SAFE_PATCH])
        await obs.until(lambda r: (bool(r.applies) and r.reason == ReadyReason.CONVERGED
                                   and r.config_hash == safe[r.name]), t,
                        "the safe patch applied and every machine Converged again")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after the safe patch")
        self.ok(f"{n}/{n} nodes took exactly one apply (NO_REBOOT) of their new render and run it")

        self.step(next(number), "reboot-requiring patch: kernel module br_netfilter (a kernel module loads at boot)")
        reboot_patch = REBOOT_PATCH if self.contract.multidoc_kubernetes else REBOOT_PATCH_V1_13
        await _patch(client, env, [SAFE_PATCH, reboot_patch])
        await obs.until(lambda r: (r.ready == "False" and r.reason == ReadyReason.REBOOT_REQUIRED
                                   and bool(r.reboot_paths)), t,
                        "every machine reporting Ready=False/RebootRequired with its rebootPaths")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after the reboot-requiring patch")
        first = next(iter(obs.rows.values()))
        self.ok(f"reported on {n}/{n} machines, applied on none; rebootPaths: {', '.join(first.reboot_paths)}")
        self.view.say(f"      {first.name} says: {first.message}")

        self.step(next(number), "remove the reboot-requiring patch")
        await _patch(client, env, [SAFE_PATCH])
        await obs.until(lambda r: r.reason == ReadyReason.CONVERGED and r.config_hash == safe[r.name], t,
                        "every machine Converged again")
        _expect_applies(obs, lambda r: [(safe[r.name], "NO_REBOOT")], "after removing the patch")
        self.ok(f"{n}/{n} machines Converged again, nothing applied")

    async def _rotation_step(self, env: SimEnvironment, obs: Observer, client: KubeClient, patches: list[str],
                             number: str) -> None:
        from ichord.demo.rotation import OPERATION, RotationDemo  # noqa: PLC0415

        self.step(number, f"CA rotation: TalosOperation {OPERATION}, kind ca-rotation, default targets talos + "
                  "kubernetes; the demo plays the operator for the hand-off")
        rotation = RotationDemo(env, client, obs, lambda text: self.view.say(f"{self.view.stamp()}   {text}"),
                                timeout=self.args.timeout, timing=self.timing,
                                out_dir=self.log_path.parent / "credentials")
        self.rotation = rotation
        before = {r.name: len(r.applies) for r in obs.rows.values()}
        await rotation.run(patches)
        per_node = {r.name: len(r.applies) - before[r.name] for r in obs.rows.values()}
        self.ok(f"Completed/Rotated through {' -> '.join(rotation.watch.stages)}; applies per node: "
                + ", ".join(f"{m} {c}" for m, c in per_node.items()) + "; every machine Converged again")

    def _summary(self, obs: Observer, requests: Counter[tuple[str, int]], managed: Counter[tuple[str, int]],
                 watches: int, elapsed: float) -> int:
        say = self.view.say
        say("summary:")
        for r in obs.rows.values():
            modes = ", ".join(sorted({m for _h, m in r.applies}))
            count = f"{len(r.applies)} " + ("apply" if len(r.applies) == 1 else "applies")
            say(f"  {r.name:<16} {r.role:<13} {count}, config {r.applies[-1][0][:12]} ({modes})"
                if r.applies else f"  {r.name:<16} {r.role:<13} no apply")
        problems: list[str] = []
        if self.rotation is not None:
            lines, problems = self.rotation.summary()
            for line in lines:
                say(f"  {line}")
        own = [*(["3 patches"] if self.args.only != "rotation" else []),
               *(["1 create and the hand-off"] if self.rotation is not None else [])]
        say(f"  Kubernetes API requests in {elapsed:.1f}s: management API {_requests(requests)}, {watches} watches "
            f"open" + (f" (the demo's own: {', '.join(own)})" if own else ""))
        say(f"  managed cluster's own API (the rotation's reads and client restarts, the hand-off's check): "
            f"{_requests(managed)}")
        say(f"  daemon log: {self.log_path}")
        if problems:
            return self._failed("; ".join(problems))
        say("demo: done, everything shown happened")
        return 0

    def _failed(self, reason: str) -> int:
        self.view.freeze()
        self.view.say(f"FAILED: {reason}")
        if self.log_path.exists():
            self.view.say(f"  daemon log: {self.log_path}")
        return 1


def _rendered(env: SimEnvironment, bundle: SecretsBundle, patches: list[str]) -> dict[str, str]:
    """Machine -> the hash of what ichord renders for it with these cluster patches."""
    cluster = replace(env.cluster_inputs(), patches=tuple(patches))
    return {m: render(bundle, cluster, env.machine_inputs(m)).hash() for m in env.machine_names}


async def _patch(client: KubeClient, env: SimEnvironment, patches: list[str]) -> None:
    await crds.clusters(client).patch(env.namespace, env.cluster_name, {"spec": {"patches": patches}})


def _requests(counts: Counter[tuple[str, int]]) -> str:
    """``N (verb n, ...), answered 4xx/5xx: ...`` for the requests an API server counted."""
    verbs: Counter[str] = Counter()
    for (verb, _status), count in counts.items():
        verbs[verb] += count
    errors = ", ".join(f"{c} {v} {s}" for (v, s), c in sorted(counts.items()) if s >= 400) or "none"
    return (f"{sum(verbs.values())} (" + ", ".join(f"{v} {c}" for v, c in verbs.most_common())
            + f"; answered 4xx/5xx: {errors})")


def _log_to(stream: TextIO, level: str) -> None:
    from ichord import log  # noqa: PLC0415

    log.configure(level, json=True, stream=stream)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception a group holds, however deeply nested."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
