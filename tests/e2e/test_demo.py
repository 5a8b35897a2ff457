"""`ichord demo` as a subprocess: the simulators and the daemon in one process, piped and on a terminal.

The rotation step's own checks run in-process against a simulated cluster nobody rotates: the
summary reads the nodes and names what does not run only the new CAs, and each stage wait is bounded.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from ichord.demo import Lines, Observer
from ichord.demo.rotation import OPERATION, RotationDemo, RotationFailed, create, follow
from ichord.kube.client import from_kubeconfig
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.e2e]

DEMO = [sys.executable, "-m", "ichord.cli", "demo"]
LEAKS = ("BEGIN", "LS0tLS1", "PRIVATE KEY")


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ICHORD_TIME_SCALE", "ICHORD_FAILPOINTS")}
    env["COLUMNS"] = "100"
    return env


def _no_secret(text: str, bundle: SecretsBundle) -> None:
    for leak in LEAKS:
        assert leak not in text
    for secret in bundle.secret_values():
        assert secret not in text


STAGES = ("Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing", "Done")


def test_demo_piped_shows_every_step_and_the_rotation_and_exits_0(e2e_bundle: SecretsBundle, tmp_path: Path) -> None:
    e2e_bundle.save(tmp_path / "secrets.yaml", force=True)
    done = subprocess.run([*DEMO, "--bundle", str(tmp_path / "secrets.yaml"), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, env=_environ(), check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert done.stderr == ""
    assert "\x1b[" not in out  # no terminal: plain lines only
    machines = ["demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1"]
    for step in ("ok: 4/4 machines Ready=True/Converged, nothing applied",
                 "ok: 4/4 nodes took exactly one apply (NO_REBOOT)",
                 "ok: reported on 4/4 machines, applied on none; rebootPaths: KernelModuleConfig br_netfilter (added)",
                 "ok: 4/4 machines Converged again, nothing applied",
                 "5/5 CA rotation: TalosOperation demo-ca-rotation, kind ca-rotation",
                 "ok: Completed/Rotated through " + " -> ".join(STAGES),
                 "demo: done, everything shown happened"):
        assert step in out, out
    for m in machines:
        # one line per transition: converged, one apply, applied, converged, reboot reported, converged
        mine = [line.split(m, 1)[1].split() for line in out.splitlines() if f"  {m} " in line and "[" in line]
        events = [" ".join(words[1:3]) for words in mine]
        # in this order (a slow machine may add a transient transition, e.g. Unreachable, in between)
        expected = iter(events)
        assert all(e in expected for e in ("Ready=True Converged", "apply #1", "Ready=True Applied",
                                           "Ready=True Converged", "Ready=False RebootRequired",
                                           "Ready=True Converged", "apply #2", "apply #3", "apply #4",
                                           "Ready=True Converged")), (m, events)
        assert sum(e.startswith("apply #") for e in events) == 4, (m, events)
        # the rotation's three applies, one per pass, each named by the stage it happened in
        for n, stage in ((2, "Accepting"), (3, "Issuing"), (4, "Dropping")):
            assert re.search(rf"  {m} +\w+ +apply #{n} NO_REBOOT, config [0-9a-f]{{12}} \({stage}\)$", out, re.M), out
        assert re.search(rf"^  {m} +\w+ +4 applies, config [0-9a-f]{{12}} \(NO_REBOOT\)$", out, re.M), out
        # the simulated node's own state: signs with and trusts only the new CAs; one apply per pass
        k8s = "new / new" if "cp" in m else "- / new"
        assert re.search(rf"^    {m} +new / new +{k8s} +1/1/1 +\d+/\d+$", out, re.M), out

    # Every stage shown as it happened, in order, with the waits and the hand-off in between.
    shown = [line.split("rotation: stage ", 1)[1].split(":")[0] for line in out.splitlines()
             if "rotation: stage " in line]
    assert shown == list(STAGES), shown
    rotation = out[out.index("rotation: stage Accepting"):]
    for what in ("kube-root-ca.crt holds the new kubernetes CA in all",
                 "CARotation=Unknown/SettlingClients: Issuing verified and kube-root-ca.crt holds the new CA; letting "
                 "in-cluster clients settle for 12 s",
                 "CARotation=Unknown/SettlingNodes: every Node is Ready; requiring it for 9 s",
                 "the managed Kubernetes API now serves with the new kubernetes CA",
                 "client restart: daemonset/kube-flannel (rollout", "client restart: daemonset/kube-proxy (rollout",
                 "client restart: deployment/coredns (rollout", "CARotation=True/Rotated"):
        assert what in rotation, rotation
    order = [rotation.index(s) for s in ("stage AwaitingCredentials", "operator: ", "stage Issuing")]
    assert order == sorted(order), rotation

    # The summary: what changed, from the simulator.
    fps = re.findall(r"^    (talos|kubernetes) CA +old ([0-9a-f]{16}) -> new ([0-9a-f]{16})$", out, re.M)
    assert [t for t, _o, _n in fps] == ["talos", "kubernetes"] and all(o != n for _t, o, n in fps), out
    for line in ("managed Kubernetes API: serves with the new kubernetes CA, accepts client certificates from the "
                 "new one(s)",
                 "bundle Secret ichord-system/demo-secrets: talos new, kubernetes new, rotation.yaml removed",
                 "BundleBackupStale=True/CARotated", "run `ichord cluster bundle-export demo -n ichord-system`",
                 "clients restarted one at a time: daemonset/kube-flannel, daemonset/kube-proxy, deployment/coredns; "
                 "available again: 3/3",
                 "stages seen: " + " -> ".join(STAGES) + "; CARotation=True/Rotated in "):
        assert line in out, out
    assert re.search(r"Kubernetes API requests in [\d.]+s: management API \d+ \(.*patch \d+", out)
    assert re.search(r"managed cluster's own API .*: \d+ \(", out)
    assert f"daemon log: {tmp_path / 'daemon.log'}" in out

    # The operator's credentials: minted, proven, written to the work directory mode 0600; paths shown, never content.
    assert "operator hand-off: minted from the new CAs in AwaitingCredentials, proven against the cluster" in out, out
    for name in ("talosconfig", "kubeconfig"):
        path = tmp_path / "credentials" / name
        assert path.stat().st_mode & 0o777 == 0o600
        assert f"operator: wrote {path} (from the new CAs; its content is never printed)" in out, out
        for line in path.read_text().splitlines():
            if len(line.strip()) > 40:  # certificates, keys, tokens
                assert line.strip() not in out and line.split(":")[-1].strip() not in out

    log = (tmp_path / "daemon.log").read_text()
    assert '"event": "became leader"' in log and '"event": "configuration applied"' in log
    assert '"event": "ca-rotation completed"' in log
    _no_secret(out, e2e_bundle)
    _no_secret(log, e2e_bundle)


def test_demo_on_a_terminal_redraws_a_table(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    # The configuration steps only: the table is the point here, the piped run shows the rotation.
    proc = subprocess.Popen([*DEMO, "--only", "config", "--workdir", str(tmp_path)], stdout=slave,
                            stderr=subprocess.PIPE, env=_environ())
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    out = b"".join(chunks).decode(errors="replace")
    assert rc == 0, out
    assert out.startswith("\x1b[?25l") and out.rstrip().endswith("\x1b[?25h")  # cursor hidden, then restored
    assert "\x1b[5A\x1b[J" in out  # the 5-line table (header + 4 machines) erased and redrawn in place
    assert re.search(r"MACHINE +ROLE +READY +REASON +APPLIES +RUNNING", out)
    assert "RebootRequired" in out and "demo: done, everything shown happened" in out
    assert "CA rotation:" not in out and "rotation: stage" not in out  # --only config: no rotation
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    table = [line for line in plain.splitlines() if line.startswith("  demo-") and "controlplane" in line]
    assert table and all(len(line.rstrip("\r")) < 100 for line in table)
    for leak in LEAKS:
        assert leak not in out


def test_demo_says_what_did_not_happen_and_exits_1(tmp_path: Path) -> None:
    done = subprocess.run([*DEMO, "--timeout", "0.001", "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=_environ(), check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: the simulators did not start within 0.001 s" in done.stdout.splitlines()


@pytest.mark.anyio
async def test_the_rotation_summary_reads_the_nodes_and_names_what_is_not_rotated(
        make_sim_env: MakeSimEnv, tmp_path: Path) -> None:
    env = await make_sim_env(management_api="separate")
    client = await from_kubeconfig(env.kubeconfig)
    try:
        said: list[str] = []
        obs = Observer(env, Lines(io.StringIO()))
        demo = RotationDemo(env, client, obs, said.append, timeout=5.0, timing=Timing().scaled(0.01),
                            out_dir=tmp_path / "credentials")
        lines, problems = demo.summary()  # nothing rotated: every node still runs the old CAs
    finally:
        await client.close()
    text = "\n".join(lines)
    assert re.search(r"^  demo-cp-1 +old / old +old / old +0/0/0 +0/0$", text, re.M), text
    assert re.search(r"^  demo-worker-1 +old / old +- / old +0/0/0 +0/0$", text, re.M), text
    for m in ("demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1"):
        assert any(p.startswith(f"{m} signs talos old trusting old") and p.endswith("not only the new CAs")
                   for p in problems), problems
    assert "the managed Kubernetes API still serves with the old kubernetes CA" in problems
    assert "the bundle Secret holds talos old, kubernetes old (rotation.yaml removed)" in problems
    assert "BundleBackupStale was not raised on the TalosCluster" in problems
    assert len(problems) == 7, problems


@pytest.mark.anyio
async def test_a_rotation_that_does_not_move_fails_within_the_bound(make_sim_env: MakeSimEnv, tmp_path: Path) -> None:
    """No daemon runs: the operation stays without a stage, and the wait ends with the reason."""
    env = await make_sim_env(management_api="separate")
    client = await from_kubeconfig(env.kubeconfig)
    try:
        demo = RotationDemo(env, client, Observer(env, Lines(io.StringIO())), lambda _t: None, timeout=0.3,
                            timing=Timing().scaled(0.01), out_dir=tmp_path)
        demo.watch.attach()
        await create(client, env)

        async def never() -> None:
            raise AssertionError("no hand-off without AwaitingCredentials")

        with anyio.fail_after(10), pytest.raises(RotationFailed) as failed:
            await follow(demo.watch, 0.3, Timing().scaled(0.01), never)
        demo.watch.detach()
    finally:
        await client.close()
    assert str(failed.value) == "the rotation stayed in its start for 0.3 s; CARotation says nothing: -"
    assert demo.watch.op["metadata"]["name"] == OPERATION and demo.watch.stages == []
