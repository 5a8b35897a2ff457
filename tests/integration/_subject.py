"""One ``backbone.Subject`` for tests whose kind has no ``managed.inputs.Inputs`` (the daemon's subject): the
operation object itself, its cluster read from ``spec.clusterRef``."""

from __future__ import annotations

from dataclasses import dataclass

from ichord.operations.managed.context import Obj


@dataclass
class OperationSubject:
    op: Obj

    @property
    def name(self) -> str:
        return str(self.op["metadata"]["name"])

    @property
    def op_namespace(self) -> str:
        return str(self.op["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.op["metadata"]["uid"])

    @property
    def status(self) -> Obj:
        return dict(self.op.get("status") or {})

    @property
    def cluster_name(self) -> str:
        return str(self.op["spec"]["clusterRef"]["name"])
