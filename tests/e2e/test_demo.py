"""`ichord demo` as a subprocess: the simulators and the daemon in one process, piped and on a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ichord.pki.bundle import SecretsBundle

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


def test_demo_piped_shows_every_step_and_exits_0(e2e_bundle: SecretsBundle, tmp_path: Path) -> None:
    e2e_bundle.save(tmp_path / "secrets.yaml", force=True)
    t0 = time.monotonic()
    done = subprocess.run([*DEMO, "--bundle", str(tmp_path / "secrets.yaml"), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=_environ(), check=False)
    elapsed = time.monotonic() - t0
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert done.stderr == ""
    assert "\x1b[" not in out  # no terminal: plain lines only
    machines = ["demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1"]
    for step in ("ok: 4/4 machines Ready=True/Converged, nothing applied",
                 "ok: 4/4 nodes took exactly one apply (NO_REBOOT)",
                 "ok: reported on 4/4 machines, applied on none; rebootPaths: KernelModuleConfig br_netfilter (added)",
                 "ok: 4/4 machines Converged again, nothing applied",
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
                                           "Ready=True Converged")), (m, events)
        assert sum(e.startswith("apply #") for e in events) == 1, (m, events)
        assert re.search(rf"^  {m} +\w+ +1 apply, config [0-9a-f]{{12}} \(NO_REBOOT\)$", out, re.M), out
    assert re.search(r"Kubernetes API requests in [\d.]+s: \d+ \(.*patch \d+", out)
    assert f"daemon log: {tmp_path / 'daemon.log'}" in out
    log = (tmp_path / "daemon.log").read_text()
    assert '"event": "became leader"' in log and '"event": "configuration applied"' in log
    _no_secret(out, e2e_bundle)
    _no_secret(log, e2e_bundle)
    assert elapsed < 30, f"the demo took {elapsed:.1f} s"


def test_demo_on_a_terminal_redraws_a_table(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen([*DEMO, "--workdir", str(tmp_path)], stdout=slave, stderr=subprocess.PIPE,
                            env=_environ())
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
