"""One ``backbone.Subject`` for tests whose kind has no ``managed.inputs.Inputs`` (the daemon's subject): the
operation object itself, its cluster read from ``spec.clusterRef``."""

from __future__ import annotations

from dataclasses import dataclass

from ichord.operations.managed.context import Obj, OperationObject


@dataclass
class OperationSubject(OperationObject):
    op: Obj

    @property
    def cluster_name(self) -> str:
        return str(self.op["spec"]["clusterRef"]["name"])
