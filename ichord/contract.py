"""Talos version contracts ichord renders for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ichord.errors import IchordError


class UnsupportedContractError(IchordError):
    pass


@dataclass(frozen=True, order=True)
class VersionContract:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}"

    @property
    def multidoc_kubernetes(self) -> bool:
        """``MultidocKubernetesConfigSupported``: contracts greater than 1.13 use the 1.14 documents."""
        return (self.major, self.minor) > (1, 13)


V1_13 = VersionContract(1, 13)
V1_14 = VersionContract(1, 14)
SUPPORTED_CONTRACTS = (V1_13, V1_14)
DEFAULT_CONTRACT = V1_14

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


class ContractMismatchError(IchordError):
    """A node runs a Talos version whose contract is not the one its configuration is rendered for: nothing is
    applied to it (docs/decisions.md#contract-match). Not a TalosError: no handler of a refused apply swallows it.

    ``endpoint``: the node's address as dialled (``node``: the node an apid proxied to, if any)."""

    def __init__(self, endpoint: str, contract: VersionContract, running: str, *, node: str | None = None) -> None:
        self.endpoint = endpoint
        self.contract = contract
        self.running = running
        where = endpoint if node is None else f"{endpoint} (node {node})"
        super().__init__(f"the node at {where} runs Talos {running or '(no version reported)'}, but the "
                         f"configuration is rendered for the {contract} contract (spec.talosVersion); nothing was "
                         "applied to it")


def running_contract(tag: str) -> VersionContract | None:
    """The contract of a running Talos version as its Version API reports it (``VersionInfo.tag``: ``v1.14.5``,
    ``v1.14.0-beta.1``): its major.minor, supported by ichord or not; None for a tag that is no version."""
    m = _VERSION.match(tag.strip())
    return None if m is None else VersionContract(int(m.group(1)), int(m.group(2)))


def runs_contract(tag: str, contract: VersionContract) -> bool:
    """A node reporting ``tag`` runs ``contract``: the same major.minor (v1.14.5 runs v1.14; v1.13.9 does not)."""
    return running_contract(tag) == contract


def parse_contract(text: str) -> VersionContract:
    """``v1.14``, ``1.14`` or ``v1.14.5`` -> the v1.14 contract; anything unsupported is refused."""
    m = _VERSION.match(text.strip())
    if m is None:
        raise UnsupportedContractError(f"{text!r} is not a Talos version; write it as v1.13 or v1.14")
    contract = VersionContract(int(m.group(1)), int(m.group(2)))
    if contract not in SUPPORTED_CONTRACTS:
        supported = ", ".join(str(c) for c in SUPPORTED_CONTRACTS)
        raise UnsupportedContractError(
            f"Talos version contract {contract} is not supported; ichord renders {supported}"
        )
    return contract
