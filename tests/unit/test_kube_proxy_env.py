"""The kube client reads HTTPS_PROXY/NO_PROXY once per API host (aiohttp's trust_env read them per request)."""

from __future__ import annotations

import pytest
from yarl import URL

from ichord.kube.client import _TrustingSession


def _session() -> _TrustingSession:
    return _TrustingSession(None, lambda: [], 5.0, None)  # type: ignore[arg-type]  # env_proxy needs no session


def test_the_proxy_of_the_environment_is_used_and_no_proxy_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "direct.example")
    s = _session()
    proxy, auth = s.env_proxy("https://api.example:6443/apis/x")
    assert proxy == URL("http://proxy.example:3128")
    assert auth is not None and auth.login == "user"
    assert s.env_proxy("https://direct.example:6443/api") == (None, None)


def test_no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert _session().env_proxy("https://api.example:6443/api") == (None, None)


def test_read_once_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    s = _session()
    first = s.env_proxy("https://api.example:6443/a")
    monkeypatch.setenv("HTTPS_PROXY", "http://other.example:3128")
    assert s.env_proxy("https://api.example:6443/b") == first  # as client-go: the environment of the start
    assert s.env_proxy("https://api2.example:6443/b")[0] == URL("http://other.example:3128")  # another host
