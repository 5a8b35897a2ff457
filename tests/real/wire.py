"""A raw HTTPS client for the differential tests: the same request, byte for byte, to the simulator and to
the real kube-apiserver, and the answer kept as it came (status code, JSON body, watch events).

It reads a kubeconfig as any client would (server, CA, a client certificate or a bearer token) and
never switches verification off. Test-only: a client key from a kubeconfig is written to the test's
temporary directory for ``ssl.load_cert_chain``.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from ichord import yamlio


@dataclass(frozen=True)
class Answer:
    code: int
    body: Any  # the JSON document, or the text when it is not JSON
    warnings: tuple[str, ...] = ()  # the Warning headers, as sent

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) and self.body.get("kind") == "Status" else None

    def field(self, *path: str) -> Any:
        node: Any = self.body
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node


class Wire:
    """One API server, reached as the kubeconfig says."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        cfg = yamlio.load(kubeconfig.read_text())
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = str(cluster["server"]).rstrip("/")
        self.ssl = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        self.headers: dict[str, str] = {}
        if "client-certificate-data" in user:
            workdir.mkdir(parents=True, exist_ok=True)
            cert, key = workdir / "client.crt", workdir / "client.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            key.chmod(0o600)
            self.ssl.load_cert_chain(cert, key)
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Wire:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Wire as an async context manager"
        return self._session

    async def call(self, method: str, path: str, body: Any = None, *,
                   content_type: str = "application/json", params: dict[str, str] | None = None) -> Answer:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {**self.headers, "Accept": "application/json", "Content-Type": content_type}
        async with self.session.request(method, self.server + path, data=data, headers=headers, params=params,
                                        timeout=aiohttp.ClientTimeout(total=30)) as resp:
            text = await resp.text()
            warnings = tuple(resp.headers.getall("Warning", []))
        try:
            return Answer(resp.status, json.loads(text), warnings)
        except ValueError:
            return Answer(resp.status, text, warnings)

    async def watch(self, path: str, params: dict[str, str], *, until: int, within: float = 20.0) -> tuple[
            int, list[dict[str, Any]]]:
        """Open a watch; the HTTP status and the first ``until`` events (fewer if the stream ends or
        ``within`` seconds pass: the caller's assertions then say what was missing)."""
        events: list[dict[str, Any]] = []
        headers = {**self.headers, "Accept": "application/json"}
        async with self.session.get(self.server + path, params={**params, "watch": "1"}, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=within + 5)) as resp:
            if resp.status != 200:
                return resp.status, [json.loads(await resp.text())]
            with anyio.move_on_after(within):
                async for line in resp.content:
                    if line.strip():
                        events.append(json.loads(line))
                    if len(events) >= until:
                        break
            return resp.status, events
