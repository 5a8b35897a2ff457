"""The printer columns of a TalosOperation as the real ``kubectl get`` shows them (the CRD's jsonPaths applied by
kubectl itself, not by ichord): header -> cell."""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.real import tools

#: The real tier's kubectl (None when it is not built: the tests that read columns skip).
KUBECTL = tools.kubectl()


async def operation_columns(kubeconfig: Path, namespace: str, name: str) -> dict[str, str]:
    """``kubectl get talosoperations NAME``: header -> cell."""
    assert KUBECTL is not None
    out = await anyio.run_process([KUBECTL, "--kubeconfig", str(kubeconfig), "-n", namespace,
                                   "get", "talosoperations", name], check=True)
    header, row = out.stdout.decode().splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[s:e].strip(): row[s:e].strip() for s, e in zip(starts, ends, strict=True)}
