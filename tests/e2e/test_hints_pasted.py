"""Every command ichord names in a message works pasted as printed (issue 27, "hints that work as written").

An operator's shell: ``ichord`` and ``kubectl`` on PATH, ``KUBECONFIG`` = the kubeconfig ``ichord sim`` wrote
(old CAs only), ``HOME`` a fresh directory. The daemon runs as a subprocess against a self-managed simulated
cluster (ichord's objects live on the cluster being rotated, the hardest case for hints: the operator's own
kubeconfig stops working from Issuing on). The test reads every Event and every condition of the cluster, its
machines and its operations as they appear, pulls out each command between backticks (and the commands the
CLI prints after "start it with:" and "Next:"), and runs it with ``bash -c`` exactly as printed, once, at the
moment it is shown. Each must exit 0. The commands run, in order:

- CertificatesExpiring (the daemon's warning window is longer than the CAs' life): ``ichord cluster rotate
  demo -n NS --targets ...`` creates a plan-only rotation (deleted again; the test then creates the default one);
- ``ichord cluster rotate demo -n NS``'s "start it with: kubectl ... patch ..." starts it;
- AwaitingCredentials (Event and condition): ``ichord cluster credentials demo -n NS --acknowledge``, pasted with
  ``-d ~/creds`` added (an operator's own directory);
- RotationCompleted, BundleBackupStale: ``ichord cluster bundle-export demo -n NS --kubeconfig
  ~/creds/kubeconfig`` (the path the hand-off wrote), which then lowers BundleBackupStale;
- ``ichord cluster status`` with that kubeconfig: its Next lines, if any.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import KubeError
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

#: A command between backticks in a message.
QUOTED = re.compile(r"`((?:ichord|kubectl) [^`]+)`")
#: A command the CLI prints after these words, to the end of the line.
PRINTED = re.compile(r"(?:start it with|next|Next): ((?:ichord|kubectl) .+)$", re.MULTILINE)


def commands_in(text: str) -> list[str]:
    return [m.strip() for m in QUOTED.findall(text)] + [m.strip() for m in PRINTED.findall(text)]


class Operator:
    """A shell with ichord on PATH, KUBECONFIG set and its own HOME; runs commands as printed."""

    def __init__(self, env: SimEnvironment, home: Path) -> None:
        self.home = home
        self.environ = {**os.environ, "HOME": str(home), "KUBECONFIG": str(env.kubeconfig),
                        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.ran: dict[str, subprocess.CompletedProcess[str]] = {}

    async def paste(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run ``command`` with bash, exactly as printed (quotes, ``~`` and all)."""
        proc = await anyio.to_thread.run_sync(lambda: subprocess.run(
            ["bash", "-c", command], env=self.environ, cwd=self.home, capture_output=True, text=True,
            timeout=300, check=False))
        self.ran[command] = proc
        assert proc.returncode == 0, f"`{command}` as printed exited {proc.returncode}: {proc.stderr}{proc.stdout}"
        return proc


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="self")


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    """The test's own reader: it trusts whatever CA the simulator serves now."""
    client = await from_kubeconfig(env.kubeconfig, trust=lambda: [env.kube.ca_pem])
    yield client
    await client.close()


async def messages(kube: KubeClient, env: SimEnvironment) -> list[str]:
    """Every Event message and every condition message of the cluster, its machines and its operations."""
    ns = env.namespace
    out = [str(e.get("message") or "") for e in (await kube.raw("GET", f"/api/v1/namespaces/{ns}/events"))["items"]]
    objs: list[dict[str, Any]] = [await crds.clusters(kube).get(ns, env.cluster_name)]
    objs += (await crds.machines(kube).list_objects(ns))[0] + (await crds.operations(kube).list_objects(ns))[0]
    for obj in objs:
        status = obj.get("status") or {}
        out += [str(c.get("message") or "") for c in status.get("conditions") or []]
        out.append(str(status.get("message") or ""))
    return out


async def new_commands(kube: KubeClient, env: SimEnvironment, seen: set[str]) -> list[str]:
    try:
        texts = await messages(kube, env)
    except KubeError:
        return []  # the API server restarts for the new CAs: look again
    found = []
    for text in texts:
        for command in commands_in(text):
            if command not in seen:
                seen.add(command)
                found.append(command)
    return found


async def test_every_hint_works_pasted_as_printed(env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    ns, name = env.namespace, env.cluster_name
    op = Operator(env, tmp_path / "home")
    op.home.mkdir()
    (tmp_path / "daemon").mkdir()
    # CAs live 10 years: a warning window longer than that makes CertificatesExpiring True (its hint is pasted too).
    daemon = Daemon(env, tmp_path / "daemon", "hints", extra_args=("--certificate-expiry-warning-days", "4000"))
    seen: set[str] = set()
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")

        async def expiring() -> str | None:
            cond = find(((await crds.clusters(kube).get(ns, name)).get("status") or {}).get("conditions"),
                        names.CERTIFICATES_EXPIRING)
            return str(cond["message"]) if cond and cond.get("status") == "True" else None

        # 1. CertificatesExpiring names the rotate command: pasted, it creates a plan-only rotation.
        message = await eventually(expiring, within=30, what="CertificatesExpiring")
        rotate = [c for c in commands_in(message) if c.startswith("ichord cluster rotate")]
        assert rotate == [f"ichord cluster rotate {name} -n {ns} --targets talos,kubernetes,kubernetes-aggregator,"
                          "etcd"], message
        seen.update(commands_in(message))
        printed = (await op.paste(rotate[0])).stdout
        planned = (await crds.operations(kube).list_objects(ns))[0]
        assert len(planned) == 1 and planned[0]["spec"]["paused"] is True, printed
        assert "start it with: kubectl -n" in printed
        await op.paste(f"kubectl -n {ns} delete talosoperation {planned[0]['metadata']['name']}")
        await eventually(lambda: _no_operations(kube, ns), within=30, what="the plan-only rotation deleted")
        # The export hint of the same message works now, before any rotation.
        for command in commands_in(message):
            if command.startswith("ichord cluster bundle-export"):
                await op.paste(command)

        # 2. The README's command, then the start hint it prints, as printed.
        printed = (await op.paste(f"ichord cluster rotate {name} -n {ns} --wait 30")).stdout
        starts = [c for c in commands_in(printed) if c.startswith("kubectl")]
        assert len(starts) == 1 and "patch talosoperation" in starts[0], printed
        await op.paste(starts[0])

        # 3. Every command the daemon names while it rotates, run when it appears; the hand-off with `-d DIR` (a
        # directory of the operator's own), so the export the rotation names later must carry that kubeconfig.
        (op.home / "creds").mkdir(mode=0o700)
        with anyio.fail_after(240):
            while True:
                for command in await new_commands(kube, env, seen):
                    hand_off = command.startswith("ichord cluster credentials")
                    await op.paste(command + " -d ~/creds" if hand_off else command)
                try:
                    ops = (await crds.operations(kube).list_objects(ns))[0]
                except KubeError:
                    ops = []
                if ops and (ops[0].get("status") or {}).get("phase") in ("Completed", "Failed"):
                    break
                await anyio.sleep(0.2)
        assert ops[0]["status"]["phase"] == "Completed", ops[0]["status"]
        for command in await new_commands(kube, env, seen):  # RotationCompleted, BundleBackupStale
            await op.paste(command)

        kubeconfig = "~/creds/kubeconfig"  # where -d wrote it, not the default place
        assert not (op.home / ".ichord" / "clusters" / name / "kubeconfig").exists()
        exports = [c for c in op.ran if c.startswith("ichord cluster bundle-export")]
        assert f"ichord cluster bundle-export {name} -n {ns} --kubeconfig {kubeconfig}" in exports, list(op.ran)
        assert any(c.startswith(f"ichord cluster credentials {name} -n {ns}") for c in op.ran), list(op.ran)

        async def backup_current() -> bool:
            cond = find(((await crds.clusters(kube).get(ns, name)).get("status") or {}).get("conditions"),
                        names.BUNDLE_BACKUP_STALE)
            return cond is not None and cond.get("status") == "False"

        await eventually(backup_current, within=30, what="BundleBackupStale lowered by the pasted export")
        # 4. The status command with the minted kubeconfig (its context namespace is the cluster's): no -n needed.
        status = (await op.paste(f"ichord cluster status {name} --kubeconfig {kubeconfig}")).stdout
        assert f"TalosCluster {ns}/{name}" in status
        for command in commands_in(status):
            if command not in op.ran:
                await op.paste(command)
        assert all(shlex.split(c)[0] in ("ichord", "kubectl") for c in op.ran)
    finally:
        if await daemon.stop() != 0:
            print(daemon.log()[-5000:])


async def _no_operations(kube: KubeClient, ns: str) -> bool:
    return not (await crds.operations(kube).list_objects(ns))[0]
