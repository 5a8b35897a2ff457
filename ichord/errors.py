"""The root of ichord's typed errors.

Every error a user can see carries a message that names the problem and what to do next; messages
never carry key or certificate material (the scrubber is the last line of defence, not the first).
"""

from __future__ import annotations


class IchordError(Exception):
    """Base class of every error ichord raises on purpose."""
