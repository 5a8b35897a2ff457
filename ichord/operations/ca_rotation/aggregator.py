"""The aggregator (front-proxy) CA's two waits on kube-system/extension-apiserver-authentication
(docs/decisions.md#aggregator-ca).

1. Before leaving Accepting: ``requestheader-client-ca-file`` holds the new CA (AwaitingAggregatorCA), then
   ClientSettleDelay timed from the condition's transition (SettlingClients), so extension API servers that
   reload the ConfigMap trust the new CA before the front-proxy certificate is signed by it in Issuing.
2. AggregatorAuthReset in Finalizing: kube-apiserver merges accepted CAs into the ConfigMap and
   never removes one. Exactly the new CA: settled. Otherwise the ConfigMap is deleted by name with a UID
   precondition (a copy kube-apiserver recreated meanwhile is never deleted) and it is checked again every
   Timing.retry (SettlingAggregator) until kube-apiserver has recreated it with the new CA alone; missing is not
   settled either.

Both read through the admin kubeconfig a Talos node issues (managed/clients.py); ichord keeps no credential of its own
for the managed cluster. Extension API servers that read the CA once are restarted by their owners, never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ichord.api.names import EXTENSION_AUTH_CA_KEY, EXTENSION_AUTH_CONFIGMAP
from ichord.failpoints import failpoint
from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict, KubeError, NotFound
from ichord.operations.managed.clients import ManagedAPIError
from ichord.pki import pem as _pem
from ichord.pki.scrub import SCRUBBER

NAMESPACE = "kube-system"
_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{EXTENSION_AUTH_CONFIGMAP}"


@dataclass(frozen=True)
class ExtensionAuth:
    uid: str
    cas: tuple[bytes, ...]  # the certificates in requestheader-client-ca-file, in order


async def read_extension_auth(kc: KubeClient) -> ExtensionAuth | None:
    """The ConfigMap now (None when it does not exist)."""
    try:
        obj: dict[str, Any] = await kc.raw("GET", _PATH)
    except NotFound:
        return None
    except KubeError as exc:
        raise ManagedAPIError(f"cannot read {NAMESPACE}/{EXTENSION_AUTH_CONFIGMAP}: "
                              f"{SCRUBBER.exception(exc)}") from None
    raw = str((obj.get("data") or {}).get(EXTENSION_AUTH_CA_KEY) or "").encode()
    return ExtensionAuth(str(obj["metadata"].get("uid") or ""), tuple(_pem.pem_blocks(raw)) if raw.strip() else ())


def holds(auth: ExtensionAuth | None, cert_pem: bytes) -> bool:
    return auth is not None and all(b in auth.cas for b in _pem.pem_blocks(cert_pem))


def holds_only(auth: ExtensionAuth | None, cert_pem: bytes) -> bool:
    return auth is not None and list(auth.cas) == list(_pem.pem_blocks(cert_pem))


@dataclass(frozen=True)
class ResetStep:
    settled: bool
    message: str


async def reset_step(kc: KubeClient, new_ca_pem: bytes) -> ResetStep:
    """One check of AggregatorAuthReset: settled, or what was done and why it is not settled yet."""
    auth = await read_extension_auth(kc)
    name = f"{NAMESPACE}/{EXTENSION_AUTH_CONFIGMAP}"
    if auth is None:
        return ResetStep(False, f"waiting for kube-apiserver to recreate {name} with the new aggregator CA")
    if holds_only(auth, new_ca_pem):
        return ResetStep(True, f"{name} holds the new aggregator CA alone")
    failpoint("ca-rotation.aggregator.delete.before")
    try:
        await kc.raw("DELETE", _PATH, body={"apiVersion": "v1", "kind": "DeleteOptions",
                                            "preconditions": {"uid": auth.uid}})
    except (NotFound, Conflict):
        pass  # gone, or recreated since the read (another UID): never deleted again on a stale read
    except KubeError as exc:
        raise ManagedAPIError(f"cannot delete {name}: {SCRUBBER.exception(exc)}") from None
    failpoint("ca-rotation.aggregator.delete.after")
    return ResetStep(False, f"{name} still listed {len(auth.cas)} front-proxy CA(s); deleted it so kube-apiserver "
                            "recreates it with the new aggregator CA alone")
