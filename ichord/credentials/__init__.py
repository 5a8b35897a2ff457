"""The operator's credentials in a CA rotation: ``ichord cluster credentials``
(docs/decisions.md#credentials-handoff).

A package of its own rather than part of ``ichord.operations.ca_rotation``: that package is the
controller's step function, run by the daemon; this is the operator's client of it (it reads the
operation and writes one annotation), used by the CLI and the demo.
"""

from ichord.credentials.handoff import (
    DEFAULT_CREDENTIALS_DIR,
    CredentialsError,
    CredentialsNotVerified,
    HandOff,
    NoRotationUnderWay,
    StageNotReached,
    hand_off,
)
from ichord.credentials.retry import RetryWindowExceeded, Verdict, classify

__all__ = [
    "DEFAULT_CREDENTIALS_DIR",
    "CredentialsError",
    "CredentialsNotVerified",
    "HandOff",
    "NoRotationUnderWay",
    "RetryWindowExceeded",
    "StageNotReached",
    "Verdict",
    "classify",
    "hand_off",
]
