"""List-then-watch informers with a local cache, one per resource kind."""

from ichord.watchers.informer import Informer, Resource, WatchEvent

__all__ = ["Informer", "Resource", "WatchEvent"]
