"""What ``ichord cluster credentials`` may replace in its directory (docs/decisions.md#cli-files).

An existing talosconfig or kubeconfig is replaced without ``--force`` only when the pair is an earlier hand-off's
for the same TalosCluster (the kubeconfig names its API server, its namespace and ``admin@<cluster>``; the
talosconfig's context is the cluster): running the command again (say with ``--acknowledge`` after checking the
files, or at the next rotation) renews them. Anything else is refused (exit 2) and kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ichord import yamlio


def _load(path: Path) -> Any:
    try:
        return yamlio.load(path.read_text())
    except Exception:  # whatever is there (unreadable, not YAML), it is not an earlier hand-off's
        return None


def earlier_hand_off(talosconfig: Path, kubeconfig: Path, *, cluster: str, server: str, namespace: str) -> bool:
    """True when both files exist and are what a hand-off wrote for this cluster (see the module docstring)."""
    talos, kube = _load(talosconfig), _load(kubeconfig)
    if not isinstance(talos, dict) or not isinstance(kube, dict):
        return False
    user = f"admin@{cluster}"
    try:
        servers = {str(c["cluster"]["server"]) for c in kube["clusters"]}
        contexts = {str(c["name"]): c["context"] for c in kube["contexts"]}
        context = contexts[str(kube["current-context"])]
    except (KeyError, TypeError):
        return False
    return (talos.get("context") == cluster and kube.get("current-context") == user and servers == {server}
            and str(context.get("namespace")) == namespace)
