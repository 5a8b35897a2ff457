"""``ichord bundle ...``: secrets bundle commands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ichord.contract import DEFAULT_CONTRACT, parse_contract
from ichord.operation_cli import DeprecatedAlias
from ichord.pki.bundle import generate_bundle
from ichord.pki.fingerprint import bundle_fingerprint, export_fingerprint
from ichord.safefile import check_destination


def register(subparsers: Any) -> None:
    bundle = subparsers.add_parser("bundle", help="Talos secrets bundle commands")
    sub = bundle.add_subparsers(dest="bundle_command", required=True, metavar="SUBCOMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate a secrets bundle as `talosctl gen secrets` does",
        description="Generate a Talos secrets bundle (secrets.yaml), written with mode 0600.",
    )
    gen.add_argument("--talos-version", default=str(DEFAULT_CONTRACT), help="version contract (default %(default)s)")
    gen.add_argument("-o", dest="output", action=DeprecatedAlias, instead="-f/--file", help=argparse.SUPPRESS)
    gen.add_argument("-f", "--file", "--output", dest="output", default="secrets.yaml", metavar="FILE",
                     help="output file (default %(default)s; its directory must exist)")
    gen.add_argument("--force", action="store_true", help="replace an existing file (never a directory)")
    gen.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    contract = parse_contract(args.talos_version)
    check_destination(Path(args.output), force=args.force)  # refused before the keys are made: exit 2
    bundle = generate_bundle(contract)
    written = bundle.save(args.output, force=args.force)
    print(f"wrote {written} (mode 0600, contract {contract})")
    print(f"bundle fingerprint {bundle_fingerprint(bundle)}")
    print(f"export fingerprint {export_fingerprint(bundle)}")
    return 0
