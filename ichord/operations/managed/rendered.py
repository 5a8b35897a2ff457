"""Render-and-compare: what ichord renders for a machine from the step's inputs, and whether the node runs it.

Every kind asks it: a rotation before it starts (no unrelated pending change swept in) and after the bundle is
replaced (every machine runs what the replaced bundle renders), a config rollout before and after it changes a node
(converged: nothing to do; staged: not applied twice; after a reboot: the render took). The comparison is of the
plain documents (``MachineConfig.plain``), so YAML spelling and document order do not count as a difference.

RPCs: one MachineConfig read per node compared; a render is local.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ichord.api.views import MachineView
from ichord.operations.managed.inputs import Inputs
from ichord.pki.scrub import SCRUBBER
from ichord.render.config import ConfigParseError, MachineConfig
from ichord.render.errors import RenderError
from ichord.render.generate import render
from ichord.render.inputs import MachineInputs
from ichord.render.trusted_cas import check_render_belongs
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosError, TalosUnreachableError


def render_of(inputs: Inputs, m: MachineView) -> MachineConfig:
    """What ichord renders for ``m`` from the step's bundle and cluster inputs (RenderError propagates)."""
    return render(inputs.bundle, inputs.cluster_inputs, MachineInputs.from_spec(m.spec))


async def _running(talos: TalosClient, endpoint: str, *, persistent: bool) -> list[Any]:
    return MachineConfig.plain_of(await talos.machine_config(endpoint, persistent=persistent))


async def runs_render(talos: TalosClient, endpoint: str, rendered: MachineConfig, *,
                      persistent: bool = False) -> bool:
    """The node's active (``persistent``: on-disk, what the next boot runs) configuration equals the render. A
    configuration ichord cannot parse is not the render; TalosErrors propagate (the caller decides).

    Every apply of a rollout is preceded by this comparison, so it is where a render the node must not receive is
    refused: one that would hand the node CAs none of which it trusts (another cluster's bundle in the Secret)
    raises BundleMismatchError, and the operation is Blocked on it with nothing applied
    (docs/decisions.md#bundle-belongs). A CA rotation's passes apply through their own path: their renders trust
    the old and the new CAs together."""
    try:
        running = await _running(talos, endpoint, persistent=persistent)
    except ConfigParseError:
        return False
    desired = rendered.plain()
    check_render_belongs(endpoint, running, desired)
    return running == desired


class Mismatch(Enum):
    """Why a machine is not known to run its render."""

    UNRENDERABLE = "unrenderable"  # ichord cannot render it (the detail says why)
    UNREACHABLE = "unreachable"  # the node did not answer at all (waiting may clear it)
    UNREADABLE = "unreadable"  # the node answered with an error, or a configuration ichord cannot parse
    DIFFERENT = "different"  # it runs something else


@dataclass(frozen=True)
class Divergence:
    machine: MachineView
    mismatch: Mismatch
    detail: str = ""  # scrubbed; empty for DIFFERENT


async def divergence(talos: TalosClient, inputs: Inputs, m: MachineView) -> Divergence | None:
    """None when ``m`` runs exactly what ichord renders for it from ``inputs``; else why not."""
    try:
        desired = render_of(inputs, m)
    except RenderError as exc:
        return Divergence(m, Mismatch.UNRENDERABLE, SCRUBBER.exception(exc))
    try:
        running = await _running(talos, m.address, persistent=False)
    except TalosUnreachableError as exc:
        return Divergence(m, Mismatch.UNREACHABLE, SCRUBBER.exception(exc))
    except (TalosError, ConfigParseError) as exc:
        return Divergence(m, Mismatch.UNREADABLE, SCRUBBER.exception(exc))
    if running != desired.plain():
        return Divergence(m, Mismatch.DIFFERENT)
    return None
