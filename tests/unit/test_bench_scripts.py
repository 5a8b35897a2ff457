"""Benchmarks that cannot rot (issue 19): every scripts/bench_*.py has a --smoke run, which .ci/run runs.

A new benchmark without --smoke fails here; the runner finds every one by the same glob, so CI runs it;
and a benchmark that cannot produce its figures exits non-zero (benchkit.require) instead of printing them.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
BENCHMARKS = sorted(SCRIPTS.glob("bench_*.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_scripts_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_there_are_benchmarks() -> None:
    assert {p.stem for p in BENCHMARKS} >= {"bench_render", "bench_talos", "bench_kube", "bench_expiry",
                                            "bench_idle", "bench_trust", "bench_rotation", "bench_all"}


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_every_benchmark_accepts_smoke(script: Path) -> None:
    """Its own parser, run as .ci/run runs it: --help lists --smoke (and importing it works)."""
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "--smoke" in done.stdout


def test_the_runner_runs_every_benchmark_but_itself_and_ci_calls_it() -> None:
    runner = load("bench_all")
    assert [p.name for p in runner.benchmarks([])] == [p.name for p in BENCHMARKS if p.stem != "bench_all"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    [line] = [i for i, text in enumerate(ci) if "scripts/bench_all.py --smoke" in text]
    assert line > next(i for i, text in enumerate(ci) if text.strip() == "make test")


def test_one_line_keeps_the_figures() -> None:
    one_line = load("bench_all").one_line
    assert one_line('{\n "a": 1,\n "b": {"c": 2}\n}\n') == '{"a":1,"b":{"c":2}}'
    assert one_line('{"figure": "event", "p50": 1}\n{"figure": "summary", "p99": 2}\n') == \
        '{"figure":"summary","p99":2}'
    assert one_line("bench_x a=1\nbench_x a=2\n") == "bench_x a=1 | bench_x a=2"
    assert one_line("") == ""


def test_require_exits_without_a_figure(capsys: pytest.CaptureFixture[str]) -> None:
    require = load("benchkit").require
    require({"a": {"b": 0.5}, "v1.14": 3, "n": 0}, ("a.b", "v1.14"), equal={"n": 0})  # all there: returns
    for figures, positive, equal in (
        ({"a": {}}, ("a.b",), {}),  # missing
        ({"a": {"b": 0.0}}, ("a.b",), {}),  # empty: zero per second is no figure
        ({"a": {"b": True}}, ("a.b",), {}),  # not a number
        ({"phases": {"InProgress": 1}}, (), {"phases": {"Completed": 1}}),  # half a rotation
    ):
        with pytest.raises(SystemExit) as exc:
            require(figures, positive, equal=equal)
        assert exc.value.code == 1
        assert "cannot produce its figures" in capsys.readouterr().err


def test_smoke_swaps_the_defaults_and_an_explicit_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    benchkit = load("benchkit")

    def parse(*argv: str, smoke: dict[str, object] | None = None) -> argparse.Namespace:
        monkeypatch.setattr(sys, "argv", ["bench_x", *argv])
        parser = argparse.ArgumentParser()
        parser.add_argument("--events", type=int, default=100)
        parser.add_argument("--scale", type=float, default=0.05)
        return benchkit.parse_args(parser, smoke if smoke is not None else {"events": 5, "scale": 0.02})

    assert (parse().events, parse().scale) == (100, 0.05)
    assert (parse("--smoke").events, parse("--smoke").scale) == (5, 0.02)
    assert parse("--smoke", "--events", "7").events == 7
    with pytest.raises(SystemExit, match="unknown options: evnets"):
        parse("--smoke", smoke={"evnets": 5})  # a renamed option cannot leave the smoke at full size
