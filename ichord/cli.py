"""Command-line entry point (one subcommand per job).

Each area registers its own subcommands (``register(subparsers)``) and sets ``func`` on its parser;
``func(args) -> int`` is the exit code. Every command keeps one contract (README "Commands"):

    0  success
    1  a runtime failure: the API server or a node did not answer, a write could not be verified
    2  bad input or a refusal (a flag, a file, a missing object, a conflicting operation): nothing was written

Errors derived from IchordError print their message, scrubbed again (it never holds secret material), on one
line; ``exit_code`` says which of 1 and 2 it is.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import NoReturn

from ichord.errors import IchordError, RuntimeFailure
from ichord.kube.errors import TLSVerificationError, Unavailable
from ichord.pki.scrub import SCRUBBER
from ichord.talos.errors import TalosUnreachableError


def exit_code(exc: IchordError) -> int:
    """1 for a runtime failure (the input was fine, the API server or a node did not answer, a write could not
    be verified), 2 for bad input or a refusal (nothing was written)."""
    if isinstance(exc, TLSVerificationError):
        return 2  # the kubeconfig's CA does not match the server's: the input must change
    return 1 if isinstance(exc, RuntimeFailure | Unavailable | TalosUnreachableError) else 2

#: Modules that add subcommands. Each exposes ``register(subparsers) -> None``.
COMMAND_MODULES = (
    "ichord.pki.cli",
    "ichord.demo",
    "ichord.run_cli",
    "ichord.cluster_cli",
    "ichord.render.cli",
    "ichord.sim.talos.cli",
    "ichord.sim.kube.cli",
    "ichord.sim.cli",
)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (``ichord: PROG: what; see `PROG --help```), exit 2."""

    def error(self, message: str) -> NoReturn:
        where = "" if self.prog == "ichord" else f"{self.prog}: "
        self.exit(2, f"ichord: {where}{message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ichord", description="Keeps Talos clusters' CAs and configuration safe.")
    parser.add_argument("--version", action="version", version=f"ichord {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub)
    return parser


def installed_version() -> str:
    """The installed distribution's version (what pip and the image were built from)."""
    try:
        return importlib.metadata.version("ichord")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except IchordError as exc:
        print(f"ichord: {SCRUBBER.text(str(exc))}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
