"""The CA a kubeconfig tells its client to verify the API server with (the trust pool's base out of cluster).

A kubeconfig names its cluster's CA either as a file (``certificate-authority``, relative to the
kubeconfig's directory) or inline (``certificate-authority-data``, base64 PEM). Only the CA is read
here: the user's credentials are never touched. A file is re-read by the pool on every request, as the
in-cluster ``ca.crt`` is; inline data cannot change while the process runs.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.kube.client import check_kubeconfig
from ichord.kube.errors import KubeConfigError


@dataclass(frozen=True)
class KubeconfigCA:
    """Where a kubeconfig's cluster CA comes from: a file path, inline PEM, or neither (system roots)."""

    kubeconfig: Path
    context: str
    file: Path | None = None
    data: bytes | None = None

    @property
    def description(self) -> str:
        if self.file is not None:
            return f"the CA file {self.file} named by the kubeconfig {self.kubeconfig} (context {self.context})"
        if self.data is not None:
            return f"the certificate-authority-data of the kubeconfig {self.kubeconfig} (context {self.context})"
        return f"nothing: the kubeconfig {self.kubeconfig} (context {self.context}) names no certificate-authority"


def default_kubeconfig_path() -> Path:
    env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return Path(env) if env else Path("~/.kube/config").expanduser()


def kubeconfig_ca(path: str | Path | None, context: str | None = None) -> KubeconfigCA:
    """The CA of ``context`` (default: current-context) in the kubeconfig at ``path``.

    Raises KubeConfigError naming the file when it cannot be read or does not name the context's cluster.
    """
    where = Path(path) if path is not None else default_kubeconfig_path()
    check_kubeconfig([where], context)  # the same one-line messages as every other command
    try:
        doc = yamlio.load(where.read_text())
    except OSError as exc:
        raise KubeConfigError(f"cannot read the kubeconfig {where}: {exc.strerror or type(exc).__name__}; "
                              f"pass --kubeconfig FILE") from None
    except YAMLError:
        raise KubeConfigError(f"the kubeconfig {where} is not valid YAML") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"the kubeconfig {where} is not a mapping")
    name = context or doc.get("current-context")
    if not name:
        raise KubeConfigError(f"the kubeconfig {where} has no current-context; pass --context NAME")
    ctx = _named(doc.get("contexts"), str(name))
    if ctx is None:
        raise KubeConfigError(f"the kubeconfig {where} has no context {name!r}")
    cluster_name = (ctx.get("context") or {}).get("cluster")
    cluster = _named(doc.get("clusters"), str(cluster_name)) if cluster_name else None
    if cluster is None:
        raise KubeConfigError(f"the kubeconfig {where}: context {name!r} names no cluster that exists")
    body = cluster.get("cluster") or {}
    raw = body.get("certificate-authority-data")
    if raw:
        try:
            data = base64.b64decode(str(raw), validate=True)
        except (binascii.Error, ValueError):
            raise KubeConfigError(f"the kubeconfig {where}: certificate-authority-data of cluster "
                                  f"{cluster_name!r} is not base64") from None
        return KubeconfigCA(where, str(name), data=data)
    file = body.get("certificate-authority")
    if file:
        ca = Path(str(file)).expanduser()
        if not ca.is_absolute():
            ca = where.parent / ca  # kubectl resolves it against the kubeconfig's own directory
        return KubeconfigCA(where, str(name), file=ca)
    return KubeconfigCA(where, str(name))


def _named(items: object, name: str) -> dict[str, Any] | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return None
