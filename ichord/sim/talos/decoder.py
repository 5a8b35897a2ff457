"""The simulated node's configuration decoder: an ApplyConfiguration Talos would refuse is refused here too.

machined decodes an applied configuration with machinery's strict decoder before anything else: an unknown
field or a value of the wrong type in any document fails the RPC with InvalidArgument ("failed to parse
config: ...") and changes nothing. The simulator applies the same rules (ichord/render/strict.py, from the
node's contract's schema), so a test or a client path that forgets ichord's own validation fails on the wire.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ichord.contract import VersionContract
from ichord.render.config import MachineConfig
from ichord.render.strict import InvalidConfigError, check_config


def refuse_undecodable(cfg: MachineConfig, contract: VersionContract) -> None:
    """Raise InvalidArgument, as machined does, when ``cfg`` holds what the decoder of ``contract`` refuses."""
    try:
        check_config(cfg, contract, "the applied configuration")
    except InvalidConfigError as exc:
        raise GRPCError(Status.INVALID_ARGUMENT, f"failed to parse config: {exc.document}: {exc.path}: "
                                                 f"{exc.detail}") from None
