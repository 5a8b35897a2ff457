"""The Talos API: client (gRPC over mutual TLS), dial bundles, typed errors, generated bindings."""

from ichord.talos.client import ApplyMode, ApplyResult, TalosClient, VersionInfo
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError

__all__ = ["ApplyMode", "ApplyResult", "DialBundle", "TalosClient", "TalosError", "VersionInfo"]
