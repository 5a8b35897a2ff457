"""Kubernetes access: client factory with a trust hook, typed errors, CRD access, status, Leases, Events."""
