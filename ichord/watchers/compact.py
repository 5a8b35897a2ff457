"""Informer caches that share their strings: every key, and every short string value, interned.

A watch event is decoded on its own, so each cached object holds its own copy of every key ("metadata",
"lastTransitionTime", ...) and of every repeated value (the apiVersion, the kind, the namespace, "Ready",
"True", a condition's message). For a TalosMachine as ichord writes it that is about 60 % of the object's memory:
4.6 KiB decoded, 1.9 KiB interned, measured on the objects bench_idle's fleet writes (docs/scaling.md). A
fleet's caches hold five objects per cluster of four machines, so the cache's share of a cluster goes from about
27 KiB to about 11 KiB. Interning costs about 25 µs per object per event, once, when it is cached.

Only strings of at most ``SHORT`` characters are interned: long values (a configuration hash, a condition's
long message) are seldom shared, and CPython frees an interned string that nothing else holds, so interning
a unique value costs nothing after the object is gone. The object is rebuilt, never changed in place.
"""

from __future__ import annotations

import sys
from typing import Any

#: Values up to this length are interned (a UID is 36, a timestamp 20, a resourceVersion a few).
SHORT = 64


def interned(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` rebuilt with its keys and short string values interned (lists and nested objects too)."""
    return _dict(obj)


def _dict(obj: dict[str, Any]) -> dict[str, Any]:
    return {sys.intern(k) if type(k) is str else k: _value(v) for k, v in obj.items()}


def _value(v: Any) -> Any:
    t = type(v)
    if t is str:
        return sys.intern(v) if len(v) <= SHORT else v
    if t is dict:
        return _dict(v)
    if t is list:
        return [_value(x) for x in v]
    return v
