#!/usr/bin/env python3
"""Run every scripts/bench_*.py in turn; one line per benchmark; exit 1 when any of them fails.

    .venv/bin/python scripts/bench_all.py --smoke [--only bench_trust ...] [--timeout SECONDS]

--smoke runs each at its smoke sizes (a few seconds each; `.ci/run` does this after `make test`), so a
benchmark that can no longer produce its figures fails CI instead of rotting. Without it each runs at its
full sizes (minutes: to re-measure them all). A benchmark fails when it exits non-zero (each checks its own
figures), prints nothing, or outlives --timeout (its whole process group is stopped: daemons included).

Each line: ``bench_all <name> ok|FAILED seconds=<wall time> <its figures on one line>`` (its summary
figure when it prints one, JSON re-dumped compactly); a failure adds the tail of its stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMOKE_TIMEOUT = 120.0  # a smoke run takes seconds; one that takes minutes is broken too
FULL_TIMEOUT = 3600.0

#: Runs of a benchmark beyond its default, each with the tools it needs (scripts/tools.sh builds them; a run
#: whose tools are absent is reported as skipped, with the reason, not failed).
VARIANTS: dict[str, tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]] = {
    # the informer's write->handler latency on the real kube-apiserver beside the simulator's (issue 15)
    "bench_kube": (("real", ("--target", "real"), ("etcd", "kube-apiserver")),),
    # ichord's objects on the real kube-apiserver, the managed clusters simulated (issue 32)
    "bench_idle": (("real", ("--management", "real"), ("etcd", "kube-apiserver")),
                   # the Talos nodes from two processes, as 5,000 x 4 needs (docs/scaling.md)
                   ("real-shared", ("--management", "real", "--talos-processes", "2", "--clusters", "2"),
                    ("etcd", "kube-apiserver"))),
    "bench_config": (("real", ("--management", "real"), ("etcd", "kube-apiserver")),),
    "bench_rotation": (("real", ("--management", "real"), ("etcd", "kube-apiserver")),),
}


def missing_tools(names: tuple[str, ...]) -> str | None:
    """Why the built tools cannot serve (None when every one of ``names`` is in $ICHORD_TOOLS_BIN)."""
    where = os.environ.get("ICHORD_TOOLS_BIN")
    if not where:
        return "$ICHORD_TOOLS_BIN is not set (run scripts/tools.sh, as .ci/run does)"
    absent = [n for n in names if not (Path(where) / n).is_file()]
    return f"not built in {where}: {', '.join(absent)}" if absent else None


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    figures: str
    why: str = ""


def benchmarks(only: list[str]) -> list[Path]:
    found = sorted(p for p in HERE.glob("bench_*.py") if p.resolve() != Path(__file__).resolve())
    if only:
        missing = sorted(set(only) - {p.stem for p in found})
        if missing:
            raise SystemExit(f"bench_all: no such benchmark: {', '.join(missing)}")
        found = [p for p in found if p.stem in only]
    return found


def one_line(stdout: str) -> str:
    """The figures on one line: a JSON document compacted, else the summary JSON line, else the lines joined."""
    text = stdout.strip()
    with contextlib.suppress(ValueError):
        return json.dumps(json.loads(text), separators=(",", ":"))
    docs: list[object] = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            docs = []
            break
        docs.append(doc)
    summary = [d for d in docs if isinstance(d, dict) and d.get("figure") == "summary"]
    if summary:
        return json.dumps(summary[-1], separators=(",", ":"))
    if docs:
        return " ".join(json.dumps(d, separators=(",", ":")) for d in docs)
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def stop_group(proc: subprocess.Popen[str]) -> None:
    """TERM, then KILL, the benchmark's own process group (it was started in a session of its own)."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def run_one(script: Path, smoke: bool, timeout: float, extra: tuple[str, ...] = (), label: str = "") -> Outcome:
    cmd = [sys.executable, str(script), *(["--smoke"] if smoke else []), *extra]
    name = f"{script.stem}[{label}]" if label else script.stem
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=HERE.parent)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
        return Outcome(name, False, time.perf_counter() - t0, one_line(out),
                       f"timed out after {timeout:g} s{tail(err)}")
    finally:
        if proc.poll() is None:  # interrupted: nothing the benchmark started may outlive it
            stop_group(proc)
    seconds = time.perf_counter() - t0
    figures = one_line(out)
    if group_alive(proc.pid):  # a daemon the benchmark did not stop: a defect, and it must not outlive the run
        stop_group(proc)
        return Outcome(name, False, seconds, figures, f"left processes running (stopped now){tail(err)}")
    if proc.returncode != 0:
        return Outcome(name, False, seconds, figures, f"exit status {proc.returncode}{tail(err)}")
    if not figures:
        return Outcome(name, False, seconds, figures, f"no figures on stdout{tail(err)}")
    return Outcome(name, True, seconds, figures)


def tail(text: str, lines: int = 15) -> str:
    """The last lines of a benchmark's stderr, indented under its line ("" when it said nothing)."""
    return "".join(f"\n    {line}" for line in text.strip().splitlines()[-lines:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="each benchmark at its smoke sizes (seconds each)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="these benchmarks only (bench_trust)")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"per benchmark (default {SMOKE_TIMEOUT:g} s with --smoke, else {FULL_TIMEOUT:g} s)")
    args = parser.parse_args()
    timeout = args.timeout or (SMOKE_TIMEOUT if args.smoke else FULL_TIMEOUT)
    scripts = benchmarks(args.only)
    t0 = time.perf_counter()
    failed = []
    runs = 0
    for script in scripts:
        outcomes = [run_one(script, args.smoke, timeout)]
        for label, extra, needs in VARIANTS.get(script.stem, ()):
            why = missing_tools(needs)
            if why:
                print(f"bench_all {script.stem}[{label}] skipped: {why}", flush=True)
                continue
            outcomes.append(run_one(script, args.smoke, timeout, extra, label))
        for outcome in outcomes:
            runs += 1
            print(f"bench_all {outcome.name} {'ok' if outcome.ok else 'FAILED'} seconds={outcome.seconds:.1f} "
                  f"{outcome.figures}", flush=True)
            if not outcome.ok:
                failed.append(outcome.name)
                print(f"  {outcome.name}: {outcome.why}", flush=True)
    print(f"bench_all: {runs} runs of {len(scripts)} benchmarks{' (smoke)' if args.smoke else ''}, {len(failed)} failed"
          f"{': ' + ', '.join(failed) if failed else ''}, {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
