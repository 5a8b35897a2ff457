"""argparse value types shared by commands of every layer (the simulators' included): a bad value is the
parser's one-line refusal with exit 2, never a traceback from deep inside a server's start."""

from __future__ import annotations

import argparse


def port(text: str) -> int:
    """A TCP port to listen on: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0: any free port)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535; 0: any free port)")
    return value
