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
