"""``ichord render diff OLD.yaml NEW.yaml --talos-version V``: what applying NEW over OLD takes.

Prints one line per changed path, ``<impact> <path>``, in the diff's stable order (unsupported
changes with their reason). Values are never printed: configurations hold keys and tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ichord.contract import parse_contract
from ichord.errors import IchordError
from ichord.render.config import MachineConfig
from ichord.render.fieldmeta import Impact, classify, normalize_role

_WIDTH = max(len(i.value) for i in Impact)


class DiffInputError(IchordError):
    pass


def add_diff_parser(render_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``diff`` to the ``ichord render`` sub-commands (``render_subparsers`` from add_subparsers)."""
    p: argparse.ArgumentParser = render_subparsers.add_parser(
        "diff",
        help="classify the changes between two machine configurations",
        description="Classify every change from OLD (what a node runs) to NEW (what it should run) as "
        "safe, install-time-only, api-server-restart, reboot or unsupported, for a Talos version contract.",
    )
    p.add_argument("old", metavar="OLD.yaml", help="the configuration the node runs")
    p.add_argument("new", metavar="NEW.yaml", help="the configuration to apply")
    # Own dests: the parent `render` parser has options of the same names with other defaults.
    p.add_argument("--talos-version", dest="diff_talos_version", required=True, help="version contract, e.g. v1.14")
    p.add_argument(
        "--role",
        dest="diff_role",
        choices=("controlplane", "worker"),
        help="machine role (default: NEW's .machine.type)",
    )
    p.set_defaults(func=run_diff)
    return p


def run_diff(args: argparse.Namespace) -> int:
    contract = parse_contract(args.diff_talos_version)
    old = _load(args.old)
    new = _load(args.new)
    role = args.diff_role or _role_of(new, args.new)
    result = classify(old, new, contract, role)
    if not result.has_changes:
        print("no changes", file=sys.stderr)
        return 0
    for c in result.changes:
        line = f"{c.impact.value:<{_WIDTH}}  {c.path}"
        if c.impact is Impact.UNSUPPORTED:
            line += f"  ({c.reason})"
        print(line)
    return 0


def _load(path: str) -> MachineConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DiffInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return MachineConfig.parse(data)
    except IchordError as exc:
        raise DiffInputError(f"{path}: {exc}") from None


def _role_of(config: MachineConfig, path: str) -> str:
    try:
        machine_type = (config.v1alpha1.get("machine") or {}).get("type")
    except KeyError:
        machine_type = None
    if machine_type is None:
        raise DiffInputError(f"{path} has no .machine.type: pass --role controlplane or --role worker")
    return normalize_role(str(machine_type))
