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

from kubernetes_asyncio.config.config_exception import ConfigException
from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.kube.client import check_kubeconfig, select_context
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
        selected = select_context(doc, context)  # the client's own reading of contexts and clusters
    except (OSError, YAMLError, ConfigException) as exc:
        raise KubeConfigError(f"cannot use the kubeconfig {where}: {exc}; pass --kubeconfig FILE") from None
    name = str(context or doc.get("current-context"))
    raw = selected.cluster.get("certificate-authority-data")
    if raw:
        try:
            data = base64.b64decode(str(raw), validate=True)
        except (binascii.Error, ValueError):
            raise KubeConfigError(f"the kubeconfig {where}: the certificate-authority-data of context {name!r} "
                                  f"is not base64") from None
        return KubeconfigCA(where, name, data=data)
    file = selected.cluster.get("certificate-authority")
    if file:
        ca = Path(str(file)).expanduser()
        if not ca.is_absolute():
            ca = where.parent / ca  # kubectl resolves it against the kubeconfig's own directory
        return KubeconfigCA(where, name, file=ca)
    return KubeconfigCA(where, name)
