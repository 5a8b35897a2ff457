"""Typed errors of the Talos API client.

Each says which node and call failed, what the node answered (gRPC status and message, never
certificate or key material) and what to check next.
"""

from __future__ import annotations

from ichord.errors import IchordError


class TalosError(IchordError):
    """A Talos API call failed. ``code`` is the gRPC status name when the node answered."""

    hint = ""

    def __init__(self, endpoint: str, method: str, detail: str, *, code: str | None = None,
                 node: str | None = None) -> None:
        self.endpoint = endpoint
        self.method = method
        self.detail = detail
        self.code = code
        self.node = node
        target = endpoint if node is None else f"{endpoint} (node {node})"
        status = f" [{code}]" if code else ""
        text = f"Talos {method} on {target} failed{status}: {detail}"
        super().__init__(text + (f". {self.hint}" if self.hint else ""))


class TalosUnreachableError(TalosError):
    hint = "Check that the node is up and that port 50000 is reachable from here"


class TalosInvalidEndpointError(TalosError):
    """The endpoint is no ``<ip or host>[:port]`` (an empty address, a URL, a port that is no number or out of range):
    nothing was dialled, and nothing will be until it is corrected."""

    hint = "A TalosMachine's spec.address is <ip or host>[:port], the port 1-65535 (default 50000)"


class TalosDeadlineError(TalosUnreachableError):
    hint = "The node did not answer within the deadline; it may be rebooting or overloaded"


class TalosCertificateError(TalosError):
    """x509 or authentication failure: either side refused the other's certificate."""

    hint = ("The node's serving certificate must chain to a trusted OS CA and the client certificate "
            "must be signed by an OS CA the node's running configuration accepts")


class TalosPermissionDeniedError(TalosError):
    hint = "The client certificate's roles (Organization) do not allow this call; it needs os:admin"


class TalosFailedPreconditionError(TalosError):
    pass


class TalosUnimplementedError(TalosError):
    hint = "This Talos version does not support the call or mode used"


class TalosInvalidArgumentError(TalosError):
    pass


class TalosNotFoundError(TalosError):
    pass


class TalosProtocolError(TalosError):
    """The node answered something ichord cannot interpret (empty response, missing spec)."""


class TalosRPCError(TalosError):
    """Any other gRPC status (Internal, Unknown, Unavailable, ...)."""
