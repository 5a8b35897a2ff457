"""The operation kinds this version of ichord runs (``spec.kind`` -> operation).

Adding a kind (docs/architecture.md#how-to-add-an-operation-kind): its description in ``api/operation_kinds.py``,
a package under ``ichord/operations/`` whose ``operation.py`` builds an ``Operation`` (an ``OperationKind`` of that
description and its ``advance``), and one line here.
"""

from __future__ import annotations

from ichord.operations.ca_rotation.operation import ca_rotation_operation
from ichord.operations.config.operation import config_operation
from ichord.operations.registry import Registry


def default_registry() -> Registry:
    registry = Registry()
    registry.register(ca_rotation_operation())  # each kind keeps its own managed-cluster clients
    registry.register(config_operation())
    return registry
