"""Is a control plane's kube-apiserver ready? Its own ``https://<node>:<localAPIServerPort>/readyz``, asked
anonymously and verified against the Kubernetes CAs the caller trusts (docs/decisions.md#ca-rotation-passes point 3;
docs/decisions.md#config-rollout's restart amendment): a ca-rotation pass and a config rollout wait on it after an
apply restarts kube-apiserver."""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import aiohttp

from ichord.pki import pem as _pem
from ichord.pki.scrub import SCRUBBER
from ichord.talos.client import split_endpoint

#: A network timeout, not a simulated duration: never scaled.
READYZ_TIMEOUT = 5.0


def node_host(address: str) -> str:
    """The host of a machine's Talos endpoint as a URL takes it (an IPv6 address in brackets)."""
    host, _port = split_endpoint(address)
    return f"[{host}]" if ":" in host else host


async def readyz(host: str, port: int, cas: Sequence[bytes]) -> str | None:
    """None when ``https://host:port/readyz`` answers 200 to an anonymous request verified against ``cas``."""
    tls = ssl.create_default_context(cadata="".join(b.decode() for ca in cas for b in _pem.pem_blocks(ca)))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=READYZ_TIMEOUT)) as session, \
                session.get(f"https://{host}:{port}/readyz", ssl=tls) as response:
            if response.status == 200:
                return None
            return f"/readyz answered {response.status}"
    except (aiohttp.ClientError, TimeoutError, ssl.SSLError, OSError) as exc:
        return f"/readyz did not answer ({type(exc).__name__}: {SCRUBBER.exception(exc) or 'timed out'})"
