"""The ca-rotation operation (docs/decisions.md#rotation-state, docs/decisions.md#ca-rotation-targets): a step function
of the cluster actor.

``advance(ctx, op)`` runs one step (the stage table is ``stage_table.STAGES``; ``ctx`` is every kind's
``managed.context.StepContext``); the per-target stages and the plan are data in ``plan``; the lifecycle around
the stages is the backbone's.
"""

from ichord.operations.ca_rotation.stage_table import advance

__all__ = ["advance"]
