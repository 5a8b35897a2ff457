"""The ca-rotation operation (ADR 0063 "Implementation", ADR 0120 §1, §5, §6): a step function of the cluster actor.

``advance(ctx, op)`` runs one step; the stage table and the plan are data in ``plan``.
"""

from ichord.operations.ca_rotation.context import RotationContext
from ichord.operations.ca_rotation.lifecycle import is_ca_rotation
from ichord.operations.ca_rotation.machine import advance

__all__ = ["RotationContext", "advance", "is_ca_rotation"]
