"""The Kubernetes client factory: kubeconfig or in-cluster, a trust hook, and a timeout on every call.

kubernetes-asyncio builds one SSLContext from a CA file and never reloads it. Here the request
session asks a ``TrustSource`` for the CA certificates on every request and uses an SSLContext for
exactly that set (cached by content), with normal verification: chain and host name or IP. The
trust pool (a later module) plugs in as the TrustSource; by default it re-reads the CA file.

No key touches a disk: kubernetes-asyncio writes a kubeconfig's ``client-key-data`` to a temporary
file it removes only at process exit, so the client certificate, key and CA data are taken out of
the kubeconfig before the library sees it, kept in memory and loaded into each SSLContext from an
anonymous memory file (memfd; a private directory removed at once where there is none).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger
from yarl import URL  # aiohttp's own URL type (a dependency of aiohttp's public API)

from ichord.kube.errors import KubeConfigError, KubeError, from_status, translate
from ichord.kube.reachability import Reachability
from ichord.metrics import KUBE_REQUEST_DURATION
from ichord.pki import pem as _pem
from ichord.pki.memfile import load_cert_chain_from_memory
from ichord.settings import Timing

#: Returns the CA certificates (PEM) the API server's certificate must chain to, asked per request.
TrustSource = Callable[[], Sequence[bytes]]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_PROC_FD = Path("/proc/self/fd")


@dataclass(frozen=True)
class ClientCertificate:
    """A kubeconfig's client certificate chain and key (PEM), held in memory only."""

    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)


class NoTrustError(KubeError):
    """The trust source returned no CA certificate: nothing could verify the API server."""


def file_trust(path: str | Path) -> TrustSource:
    """Trust what ``path`` holds, re-read on every call (the in-cluster ``ca.crt`` is refreshed in place)."""
    p = Path(path)

    def read() -> Sequence[bytes]:
        return [p.read_bytes()]
    return read


class _TrustingSession:
    """Stands in for the aiohttp session of kubernetes-asyncio's RESTClientObject."""

    def __init__(self, session: aiohttp.ClientSession, trust: TrustSource, timeout: float,
                 client_cert: ClientCertificate | None) -> None:
        self._session = session
        self._trust = trust
        self._timeout = timeout
        self._client_cert = client_cert
        self._contexts: dict[bytes, ssl.SSLContext] = {}
        self._proxies: dict[tuple[str, str], tuple[URL | None, aiohttp.BasicAuth | None]] = {}
        #: Every request reports here (an answer, or a failure to reach or verify the server): /readyz reads it.
        self.reachability = Reachability()

    def ssl_context(self) -> ssl.SSLContext:
        # A set: a CA both in ca.crt and among the trust pool's extras (after a rotation, until the pool clears) is
        # the same trust, so clearing it keeps the context and its pooled connections (no new TLS handshake).
        pems = b"".join(dict.fromkeys(_pem.pem_blocks(b"\n".join(self._trust()))))
        if not pems:
            raise NoTrustError("no CA certificate to verify the Kubernetes API server with; check the "
                               "kubeconfig's certificate-authority or the service account's ca.crt")
        ctx = self._contexts.get(pems)
        if ctx is None:
            ctx = ssl.create_default_context(cadata=pems.decode())
            if self._client_cert is not None:
                load_client_certificate(ctx, self._client_cert)
            self._contexts = {pems: ctx}  # one live set: an old trust set is not kept
        return ctx

    def env_proxy(self, url: str | URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """HTTPS_PROXY/NO_PROXY for ``url``'s host, read once per host as client-go reads them once per process.

        aiohttp's ``trust_env`` read them (and ~/.netrc) on every request, each time in a worker thread: two
        thread hops per request were the kube client's largest cost while a fleet converged."""
        u = URL(url)
        key = (u.scheme, u.host or "")
        found = self._proxies.get(key)
        if found is None:
            try:
                found = get_env_proxy_for_url(u)
            except LookupError:
                found = (None, None)
            self._proxies[key] = found
        return found

    async def request(self, **kwargs: Any) -> aiohttp.ClientResponse:
        if kwargs.get("proxy") is None:
            kwargs["proxy"], kwargs["proxy_auth"] = self.env_proxy(kwargs["url"])
        try:
            kwargs["ssl"] = self.ssl_context()
        except NoTrustError as exc:
            self.reachability.failed(exc)
            raise
        timeout = kwargs.get("timeout")
        if timeout is None or timeout == aiohttp.ClientTimeout():
            kwargs["timeout"] = aiohttp.ClientTimeout(total=self._timeout)
        verb, code, start = str(kwargs.get("method", "GET")).upper(), "error", time.monotonic()
        try:
            resp = await self._session.request(**kwargs)
        except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError) as exc:
            self.reachability.failed(exc)
            raise
        else:
            code = str(resp.status)
            self.reachability.ok()
            return resp
        finally:
            KUBE_REQUEST_DURATION.labels(verb=verb, code=code).observe(time.monotonic() - start)

    async def close(self) -> None:
        await self._session.close()

    @property
    def closed(self) -> bool:
        return self._session.closed


@dataclass
class KubeClient:
    """One API connection; ``api`` is a kubernetes-asyncio ApiClient usable with the generated APIs."""

    api: k8s.ApiClient
    namespace: str
    timeout: float
    _session: _TrustingSession = field(repr=False)
    #: Plural -> what is told each object a write through this client returned (watchers/written.py).
    _written: dict[str, list[Callable[[dict[str, Any]], None]]] = field(default_factory=dict, repr=False)

    async def close(self) -> None:
        await self.api.close()

    def on_written(self, plural: str, observer: Callable[[dict[str, Any]], None]) -> None:
        """Tell ``observer`` every object of ``plural`` as a create, update, patch or delete through this client
        returned it (the caller's own writes, before any watch event brings them)."""
        self._written.setdefault(plural, []).append(observer)

    def wrote(self, plural: str, obj: dict[str, Any]) -> None:
        for observer in self._written.get(plural, ()):
            observer(obj)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def reachability(self) -> Reachability:
        """Whether requests reach a server this client verifies (for /readyz)."""
        return self._session.reachability

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def coordination(self) -> k8s.CoordinationV1Api:
        return k8s.CoordinationV1Api(self.api)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def policy(self) -> k8s.PolicyV1Api:
        return k8s.PolicyV1Api(self.api)

    async def raw(self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (),
                  body: Any = None, content_type: str = "application/json",
                  limits: aiohttp.ClientTimeout | None = None, stream: bool = False) -> Any:
        """A request by path with dict bodies: JSON result, or the open response when ``stream``.

        Failures raise typed KubeErrors; a streamed response is the caller's to close.
        """
        headers = {"Accept": "application/json", "Content-Type": content_type}
        await self.api.update_params_for_auth(headers, [], ["BearerToken"])
        url = self.host + path + ("?" + urlencode(list(query)) if query else "")
        data = json.dumps(body) if body is not None else None
        with translate():
            resp = await self._session.request(method=method, url=url, headers=headers, data=data,
                                               timeout=limits or aiohttp.ClientTimeout(total=self.timeout))
            if resp.status >= 400:
                text = await resp.read()
                resp.release()
                raise from_status(resp.status, text, resp.reason or "")
            if stream:
                return resp
            try:
                return await resp.json(content_type=None)
            finally:
                resp.release()


def load_client_certificate(ctx: ssl.SSLContext, cert: ClientCertificate) -> None:
    """Load ``cert`` into ``ctx`` without writing its key to disk (ichord.pki.memfile)."""
    load_cert_chain_from_memory(ctx, cert.cert_pem, cert.key_pem)


def _build(cfg: k8s.Configuration, namespace: str, timeout: float, trust: TrustSource | None,
           client_cert: ClientCertificate | None = None) -> KubeClient:
    if not cfg.verify_ssl:  # negative: a kubeconfig that skips verification is refused, never honoured
        raise KubeError("the kubeconfig disables TLS verification (insecure-skip-tls-verify); "  # negative
                        "ichord refuses to talk to an API server it cannot verify")
    api = k8s.ApiClient(cfg)
    rest = api.rest_client
    if trust is None:
        if not cfg.ssl_ca_cert:
            raise NoTrustError("the kubeconfig names no certificate-authority; pass a trust source")
        trust = file_trust(cfg.ssl_ca_cert)
    # The library's private session is replaced (pyproject bounds kubernetes-asyncio to the versions
    # whose RESTClientObject sends every request through ``pool_manager.request``).
    # Its proxy settings are read once per host (_TrustingSession.env_proxy), not per request with trust_env.
    library = rest.pool_manager
    untrusting = aiohttp.ClientSession(connector=library.connector, trust_env=False,
                                       read_bufsize=2**21)  # watch events of large objects, as the library sets
    library.detach()  # the connector now belongs to the new session
    session = _TrustingSession(untrusting, trust, timeout, client_cert)
    rest.pool_manager = session  # type: ignore[assignment]  # duck-typed: request() and close()
    return KubeClient(api, namespace, timeout, session)


async def from_kubeconfig(path: str | Path | None = None, *, context: str | None = None,
                          trust: TrustSource | None = None, timing: Timing | None = None,
                          namespace: str | None = None) -> KubeClient:
    """A client from a kubeconfig file (KUBECONFIG / ~/.kube/config when ``path`` is None).

    A file that is missing, is not YAML or lacks the context raises KubeConfigError naming the file. The
    client certificate, key and CA data never reach kubernetes-asyncio (which would write them to temporary
    files kept until exit); they stay in memory (see ``load_client_certificate``).
    """
    files = kubeconfig_files(path)
    check_kubeconfig(files, context)
    where = paths = os.pathsep.join(str(f) for f in files)
    try:
        with translate():
            merged = KubeConfigMerger(paths).config
    except ConfigException as exc:
        raise KubeConfigError(f"cannot use the kubeconfig {where}: {exc}; pass --kubeconfig FILE") from None
    except OSError as exc:
        raise KubeConfigError(f"cannot read the kubeconfig {where}: {exc.strerror or type(exc).__name__}; "
                              f"pass --kubeconfig FILE") from None
    if merged is None:
        raise KubeConfigError(f"cannot use the kubeconfig {where}: no such file; pass --kubeconfig FILE")
    return await _from_config(merged, where, context=context, trust=trust, timing=timing, namespace=namespace)


async def from_kubeconfig_data(data: bytes, *, what: str = "(in memory)", context: str | None = None,
                               trust: TrustSource | None = None, timing: Timing | None = None,
                               namespace: str | None = None) -> KubeClient:
    """A client from a kubeconfig held in memory (e.g. the admin kubeconfig a Talos node issues).

    Nothing is written anywhere: no file for the kubeconfig, none for its key. ``what`` names it in
    errors; a relative file path inside it resolves against the working directory.
    """
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError:
        raise KubeConfigError(f"cannot use {what}: it is not YAML") from None
    return await _from_config(doc, what, context=context, trust=trust, timing=timing, namespace=namespace)


async def _from_config(config: Any, where: str, *, context: str | None, trust: TrustSource | None,
                       timing: Timing | None, namespace: str | None) -> KubeClient:
    """``config``: KubeConfigMerger's node (file paths resolve per file) or a plain mapping."""
    cfg = k8s.Configuration()
    try:
        with translate():
            selected = select_context(getattr(config, "value", config), context)
            client_cert = _take_client_certificate(selected.user, selected.user_base)
            # A certificate-authority file stays with the library: it is a path, re-read per request.
            ca_data = _take_data(selected.cluster, "certificate-authority-data", None)
            # Whatever the library still writes (an exec plugin's certificate) lands in a private directory
            # that is gone before this returns; finding a file there refuses the kubeconfig.
            scratch = tempfile.mkdtemp(prefix="ichord-kubeconfig-")
            try:
                loader = KubeConfigLoader(config_dict=config, active_context=context, config_base_path=None,
                                          temp_file_path=scratch)
                await loader.load_and_set(cfg)
                written = os.listdir(scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if written:
                raise ConfigException("its exec credential plugin returns a client certificate, which the "
                                      "library would keep on disk; use a plugin that returns a token")
    except ConfigException as exc:
        # A malformed kubeconfig must read as a usage error, not a traceback; the library's text names the
        # missing key or context, never credentials.
        raise KubeConfigError(f"cannot use the kubeconfig {where}: {_one_line(str(exc))}; pass --kubeconfig FILE "
                              f"(and --context NAME)") from None
    except OSError as exc:
        raise KubeConfigError(f"cannot read the kubeconfig {where}: {exc.strerror or type(exc).__name__}; "
                              f"pass --kubeconfig FILE") from None
    if trust is None and ca_data is not None:
        trust = _static_trust(ca_data)
    if client_cert is not None:
        _check_client_certificate(client_cert, where)
    ns = namespace or selected.namespace or "default"
    return _build(cfg, ns, (timing or Timing.from_env()).kube_call_timeout, trust, client_cert)


@dataclass
class _Selected:
    """The current context's user and cluster entries (mutable: the loader reads what is left)."""

    user: dict[str, Any]
    user_base: str
    cluster: dict[str, Any]
    namespace: str | None


def select_context(doc: Any, context: str | None) -> _Selected:
    """The context's user and cluster entries of a kubeconfig document (ConfigException when absent)."""
    if not isinstance(doc, dict):
        raise ConfigException("it is not a YAML mapping")
    name = context or doc.get("current-context")
    ctx = _named(doc.get("contexts"), name, "context")
    body = _value(ctx).get("context") or {}
    if not isinstance(body, dict):
        raise ConfigException(f"context {name} has no context mapping")
    user_entry = _named(doc.get("users"), body.get("user"), "user") if body.get("user") else None
    cluster_entry = _named(doc.get("clusters"), body.get("cluster"), "cluster")
    user = _value(user_entry).get("user") if user_entry is not None else None
    cluster = _value(cluster_entry).get("cluster")
    if not isinstance(cluster, dict):
        raise ConfigException(f"cluster {body.get('cluster')} has no cluster mapping")
    user_path = getattr(user_entry, "path", None)
    ns = body.get("namespace")
    return _Selected(user if isinstance(user, dict) else {}, os.path.dirname(os.path.abspath(user_path))
                     if user_path else "", cluster, str(ns) if ns else None)


def _named(entries: Any, name: Any, what: str) -> Any:
    for entry in entries or []:
        if _value(entry).get("name") == name:
            return entry
    raise ConfigException(f"no {what} named {name}")


def _value(entry: Any) -> dict[str, Any]:
    value = getattr(entry, "value", entry)  # KubeConfigMerger wraps list entries in ConfigNodes
    if not isinstance(value, dict):
        raise ConfigException("an entry is not a mapping")
    return value


def _take_data(entry: dict[str, Any], data_key: str, file_key: str | None, base: str = "") -> bytes | None:
    """Remove ``data_key`` (base64) or ``file_key`` (a path) from ``entry`` and return the bytes."""
    data = entry.pop(data_key, None)
    path = entry.pop(file_key, None) if data is None and file_key else None
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigException(f"{data_key} is not base64") from None
    if path:
        with open(os.path.join(base, str(path)), "rb") as f:
            return f.read()
    return None


def _take_client_certificate(user: dict[str, Any], base: str) -> ClientCertificate | None:
    cert = _take_data(user, "client-certificate-data", "client-certificate", base)
    key = _take_data(user, "client-key-data", "client-key", base)
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigException("the user has a client certificate without its key, or a key without its certificate")
    return ClientCertificate(cert, key)


def _check_client_certificate(cert: ClientCertificate, where: str) -> None:
    try:
        load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert)
    except ssl.SSLError as exc:
        raise KubeConfigError(f"cannot use the kubeconfig {where}: its client certificate and key do not load "
                              f"({exc.reason or 'not a matching PEM pair'}); pass --kubeconfig FILE") from None


def _static_trust(ca: bytes) -> TrustSource:
    def read() -> Sequence[bytes]:
        return [ca]
    return read


def kubeconfig_files(path: str | Path | None) -> list[Path]:
    """The files a kubeconfig argument means: ``path``, else $KUBECONFIG's list, else ~/.kube/config."""
    if path:
        return [Path(path).expanduser()]
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in env] or [Path("~/.kube/config").expanduser()]


def check_kubeconfig(files: Sequence[Path], context: str | None) -> None:
    """Raise KubeConfigError, naming the file, when no file exists, one is not YAML, or the context is missing.

    Done before kubernetes-asyncio loads them: it logs a missing file and goes on to a misleading
    "Expected key current-context", and lets YAML errors escape as tracebacks.
    """
    docs: list[tuple[Path, dict[str, Any]]] = []
    for f in files:
        try:
            text = f.read_text()
        except FileNotFoundError:
            continue  # kubectl skips a missing entry of a KUBECONFIG list too
        except OSError as exc:
            raise KubeConfigError(f"cannot read the kubeconfig {f}: {exc.strerror or type(exc).__name__}") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"the kubeconfig {f} is not valid YAML ({_yaml_problem(exc)}); "
                                  f"fix it or pass --kubeconfig FILE") from None
        if not isinstance(doc, dict):
            raise KubeConfigError(f"the kubeconfig {f} is not a kubeconfig (no mapping of clusters, users and "
                                  f"contexts); pass --kubeconfig FILE") from None
        docs.append((f, doc))
    if not docs:
        missing = ", ".join(str(f) for f in files)
        raise KubeConfigError(f"the kubeconfig {missing} does not exist; pass --kubeconfig FILE or set KUBECONFIG")
    where = ", ".join(str(f) for f, _ in docs)
    name = context or next((str(d["current-context"]) for _, d in docs if d.get("current-context")), None)
    if not name:
        raise KubeConfigError(f"the kubeconfig {where} sets no current-context; pass --context NAME")
    known = [str(c.get("name")) for _, d in docs for c in (d.get("contexts") or []) if isinstance(c, dict)]
    if name not in known:
        has = f" (it has: {', '.join(known)})" if known else " (it has none)"
        raise KubeConfigError(f"the kubeconfig {where} has no context {name!r}{has}; pass --context NAME")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # Only the position and the parser's complaint: the snippet could hold a client key.
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or 'cannot parse'}"
    return type(exc).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def in_cluster(*, trust: TrustSource | None = None, timing: Timing | None = None, namespace: str | None = None,
               service_account: Path = SERVICE_ACCOUNT_DIR, environ: dict[str, str] | None = None) -> KubeClient:
    """The pod's service-account client; ``ca.crt`` is re-read per request unless ``trust`` is given.

    The kubelet refreshes the projected ``ca.crt`` in place, so a new cluster CA is trusted without a
    restart once the file carries it.
    """
    cfg = k8s.Configuration()
    loader = InClusterConfigLoader(token_filename=str(service_account / "token"),
                                   cert_filename=str(service_account / "ca.crt"),
                                   environ=dict(os.environ) if environ is None else environ)
    try:
        loader.load_and_set(cfg)
    except ConfigException as exc:
        raise KubeError(f"no in-cluster Kubernetes configuration ({exc}); run in a pod or pass --kubeconfig") from None
    ns_file = service_account / "namespace"
    ns = namespace or (ns_file.read_text().strip() if ns_file.exists() else "default")
    return _build(cfg, ns, (timing or Timing.from_env()).kube_call_timeout, trust)
