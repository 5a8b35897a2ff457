"""Kubernetes access: client factory with a trust hook, typed errors, CRD access, status, Leases, Events."""

from ichord.kube import lazy_client

# Before any module here imports kubernetes_asyncio: its generated models then load one by one as used.
lazy_client.install()
