"""Finding helm for the chart tests: $ICHORD_HELM, PATH, or the tools build under ~/.cache/ichord/tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ichord import yamlio

CHART = Path(__file__).resolve().parents[1] / "helm" / "ichord"
#: helm built with `go install` reports Kubernetes v1.20 unless told; the chart needs >= 1.27.
KUBE_VERSION = "1.31.0"


def find_helm() -> str | None:
    """$ICHORD_HELM, else the helm scripts/tools.sh built for the current pins, else PATH, else any earlier build."""
    env = os.environ.get("ICHORD_HELM")
    if env and Path(env).is_file():
        return env
    from tests.real import tools

    pinned = tools.tool("helm")
    if pinned is not None:
        return str(pinned)
    found = shutil.which("helm")
    if found:
        return found
    built = sorted(Path.home().glob(".cache/ichord/tools/*/bin/helm"))
    return str(built[-1]) if built else None


def render(*args: str, namespace: str = "ichord-system", release: str = "ichord") -> list[dict[str, Any]]:
    """`helm template` of the chart with ``args`` (e.g. --set k=v); the documents, parsed."""
    helm = find_helm()
    if helm is None:
        raise FileNotFoundError("helm")
    out = subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace,
                          "--kube-version", KUBE_VERSION, *args],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [d for d in yamlio.load_all(out) if d]
