"""Where the real tier's binaries are: ``$ICHORD_TOOLS_BIN``, else the cache directory that
``scripts/tools.sh`` builds into (it prints it; ``--print-bin`` prints it without building).

Tests ask ``missing(...)`` for a skip reason: they skip only when a binary is absent (with the
build's error when .ci/run tried and failed: ``$ICHORD_TOOLS_ERROR``)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "tools.sh"


@functools.cache
def bin_dir() -> Path | None:
    """The directory the pinned binaries are in (None when it cannot be known: no go, no bash)."""
    env = os.environ.get("ICHORD_TOOLS_BIN")
    if env:
        return Path(env)
    if shutil.which("bash") is None or shutil.which("go") is None:
        return None
    result = subprocess.run(["bash", str(SCRIPT), "--print-bin"], capture_output=True, text=True, check=False,
                            timeout=60)
    return Path(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else None


def tool(name: str) -> Path | None:
    """The built binary ``name``, or None when it has not been built."""
    directory = bin_dir()
    path = directory / name if directory is not None else None
    return path if path is not None and os.access(path, os.X_OK) else None


def kubectl() -> str | None:
    """The built kubectl, else the machine's (scripts/tools.sh builds one only when the machine's is
    missing or more than one minor away from the pinned API server)."""
    built = tool("kubectl")
    return str(built) if built is not None else shutil.which("kubectl")


def missing(*names: str) -> str | None:
    """Why the tests needing ``names`` must skip, or None when every one is there."""
    absent = [n for n in names if (kubectl() if n == "kubectl" else tool(n)) is None]
    if not absent:
        return None
    failed = os.environ.get("ICHORD_TOOLS_ERROR")  # .ci/run: the build was tried and failed
    if failed:
        return f"{', '.join(absent)} not built: {failed}"
    where = bin_dir()
    place = str(where) if where is not None else (
        "$ICHORD_TOOLS_BIN or what `scripts/tools.sh --print-bin` prints; it cannot run here: go or bash missing?")
    return f"{', '.join(absent)} not built: run scripts/tools.sh (it builds into {place})"
