"""CA-rotation vocabulary of the API (TalosOperation.status.caRotation.stage)."""

from __future__ import annotations

import enum


class Stage(enum.Enum):
    """The stages of a ca-rotation (docs/decisions.md#rotation-state, docs/decisions.md#ca-rotation-passes), in
    order."""

    ACCEPTING = "Accepting"
    AWAITING_CREDENTIALS = "AwaitingCredentials"
    ISSUING = "Issuing"
    DROPPING = "Dropping"
    FINALIZING = "Finalizing"
    DONE = "Done"

    @classmethod
    def parse(cls, text: str) -> Stage:
        for s in cls:
            if s.value.lower() == text.strip().lower():
                return s
        raise ValueError(f"unknown stage {text!r}; one of: {', '.join(s.value for s in cls)}")
