"""Typed errors of the renderer. Messages name the problem and what to do; never key material."""

from __future__ import annotations

from ichord.errors import IchordError


class RenderError(IchordError):
    """The machine configuration cannot be rendered; nothing was produced."""


class RenderInputError(RenderError):
    """A TalosCluster / TalosMachine input is invalid. ``field`` is its spec path (``spec.endpoint``)."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")


class PatchError(RenderError):
    """A config patch is invalid, conflicts with the configuration, or removes a required document.

    ``patch`` labels the patch (``cluster patch 2``, ``machine patch 1``).
    """

    def __init__(self, patch: str, problem: str, fix: str = "fix or remove the patch") -> None:
        self.patch = patch
        self.problem = problem
        super().__init__(f"{patch}: {problem}; {fix}")
