"""The admin kubeconfig a control plane hands out (Kubeconfig RPC): a gzip tar with one file.

Like Talos, the client certificate is signed by the issuing Kubernetes CA (365 days) and the tar
lacks its end-of-archive blocks (the handler closes the gzip writer, not the tar writer).
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import io
import tarfile

from cryptography.x509.oid import ExtendedKeyUsageOID

from ichord import yamlio
from ichord.sim.talos.certs import sign_leaf
from ichord.sim.talos.config_view import ConfigView

ADMIN_CERT_VALIDITY = dt.timedelta(days=365)


def admin_kubeconfig(view: ConfigView, server: str | None = None) -> bytes:
    """``server`` overrides the configuration's cluster endpoint (where a simulated API server listens)."""
    issuing = view.k8s_issuing
    if issuing is None or issuing.key_pem is None:
        raise LookupError("no issuing Kubernetes API CA in the configuration")
    cert, key = sign_leaf(issuing.signer_pem, issuing.key_pem, common_name="admin",
                          organizations=("system:masters",), usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
                          validity=ADMIN_CERT_VALIDITY)
    name = view.cluster_name or "talos"
    b64 = base64.b64encode
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server or view.endpoint,
            "certificate-authority-data": b64(b"".join(view.k8s_accepted)).decode()}}],
        "users": [{"name": f"admin@{name}", "user": {
            "client-certificate-data": b64(cert).decode(), "client-key-data": b64(key).decode()}}],
        "contexts": [{"name": f"admin@{name}", "context": {
            "cluster": name, "namespace": "default", "user": f"admin@{name}"}}],
        "current-context": f"admin@{name}",
    }
    return yamlio.dump(doc).encode()


def archive(kubeconfig: bytes) -> bytes:
    """gzip(tar with ``kubeconfig``, mode 0600) without the tar end-of-archive blocks."""
    buf = io.BytesIO()
    info = tarfile.TarInfo("kubeconfig")
    info.size = len(kubeconfig)
    info.mode = 0o600
    info.mtime = int(dt.datetime.now(dt.UTC).timestamp())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(kubeconfig))
        end = tar.offset  # header(s) and padded data; what follows is the end-of-archive padding
    return gzip.compress(buf.getvalue()[:end])
