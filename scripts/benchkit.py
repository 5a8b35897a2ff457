"""What every ``scripts/bench_*.py`` shares: its ``--smoke`` sizes and the check that its figures were produced.

A benchmark nobody runs rots (issue 19): ``scripts/bench_all.py --smoke`` runs each one at its smoke sizes in
``.ci/run``, and a benchmark that cannot produce its figures (a timeout, a missing or empty figure, an
exception) exits non-zero there instead of printing numbers no one can trust.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def parse_args(parser: argparse.ArgumentParser, smoke: Mapping[str, Any]) -> argparse.Namespace:
    """Parse with a ``--smoke`` flag that swaps the defaults for ``smoke`` (a flag given explicitly still wins)."""
    sizes = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in smoke.items())
    parser.add_argument("--smoke", action="store_true",
                        help=f"a smoke run of a few seconds ({sizes}); exits non-zero without its figures")
    args = parser.parse_args()
    unknown = [k for k in smoke if not hasattr(args, k)]
    if unknown:  # a renamed option must not silently leave the smoke at full size
        raise SystemExit(f"{name()}: smoke sizes for unknown options: {', '.join(unknown)}")
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args()
    return args


def name() -> str:
    return Path(sys.argv[0]).stem


def _lookup(figures: Mapping[str, Any], path: str) -> Any:
    if path in figures:  # a key that holds a dot itself (v1.14)
        return figures[path]
    value: Any = figures
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def require(figures: Mapping[str, Any], positive: Iterable[str] = (), *,
            equal: Mapping[str, Any] | None = None) -> None:
    """Exit 1 (after the figures were printed) unless every ``positive`` path (``a.b``) is a number > 0 and
    every ``equal`` path has its value."""
    problems = []
    for path in positive:
        value = _lookup(figures, path)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            problems.append(f"{path}={value!r} (want a number > 0)")
    for path, want in (equal or {}).items():
        value = _lookup(figures, path)
        if value != want:
            problems.append(f"{path}={value!r} (want {want!r})")
    if problems:
        print(f"{name()}: cannot produce its figures: {'; '.join(problems)}", file=sys.stderr, flush=True)
        raise SystemExit(1)


class Deadline:
    """A bound on a wait that spins on a condition: past it the benchmark exits, naming what it waited for."""

    def __init__(self, seconds: float, what: str) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds
        self.what = what

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise SystemExit(f"{name()}: timed out after {self.seconds:g} s waiting for {self.what}")
