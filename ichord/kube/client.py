"""The Kubernetes client factory: kubeconfig or in-cluster, a trust hook, and a timeout on every call.

kubernetes-asyncio builds one SSLContext from a CA file and never reloads it. Here the request
session asks a ``TrustSource`` for the CA certificates on every request and uses an SSLContext for
exactly that set (cached by content), with normal verification: chain and host name or IP. The
trust pool (a later module) plugs in as the TrustSource; by default it re-reads the CA file.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from ichord.kube.errors import KubeConfigError, KubeError, from_status, translate
from ichord.kube.reachability import Reachability
from ichord.metrics import KUBE_REQUEST_DURATION
from ichord.pki import pem as _pem
from ichord.settings import Timing

#: Returns the CA certificates (PEM) the API server's certificate must chain to, asked per request.
TrustSource = Callable[[], Sequence[bytes]]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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
                 client_cert: tuple[str, str | None] | None) -> None:
        self._session = session
        self._trust = trust
        self._timeout = timeout
        self._client_cert = client_cert
        self._contexts: dict[bytes, ssl.SSLContext] = {}
        #: Every request reports here (an answer, or a failure to reach or verify the server): /readyz reads it.
        self.reachability = Reachability()

    def ssl_context(self) -> ssl.SSLContext:
        pems = b"".join(_pem.pem_blocks(b"\n".join(self._trust())))
        if not pems:
            raise NoTrustError("no CA certificate to verify the Kubernetes API server with; check the "
                               "kubeconfig's certificate-authority or the service account's ca.crt")
        ctx = self._contexts.get(pems)
        if ctx is None:
            ctx = ssl.create_default_context(cadata=pems.decode())
            if self._client_cert is not None:
                ctx.load_cert_chain(self._client_cert[0], self._client_cert[1])
            self._contexts = {pems: ctx}  # one live set: an old trust set is not kept
        return ctx

    async def request(self, **kwargs: Any) -> aiohttp.ClientResponse:
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

    async def close(self) -> None:
        await self.api.close()

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


def _build(cfg: k8s.Configuration, namespace: str, timeout: float, trust: TrustSource | None) -> KubeClient:
    if not cfg.verify_ssl:
        raise KubeError("the kubeconfig disables TLS verification (insecure-skip-tls-verify); ichord refuses "
                        "to talk to an API server it cannot verify")
    api = k8s.ApiClient(cfg)
    rest = api.rest_client
    if trust is None:
        if not cfg.ssl_ca_cert:
            raise NoTrustError("the kubeconfig names no certificate-authority; pass a trust source")
        trust = file_trust(cfg.ssl_ca_cert)
    client_cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file else None
    session = _TrustingSession(rest.pool_manager, trust, timeout, client_cert)
    rest.pool_manager = session  # type: ignore[assignment]  # duck-typed: request() and close()
    return KubeClient(api, namespace, timeout, session)


async def from_kubeconfig(path: str | Path | None = None, *, context: str | None = None,
                          trust: TrustSource | None = None, timing: Timing | None = None,
                          namespace: str | None = None) -> KubeClient:
    """A client from a kubeconfig file (KUBECONFIG / ~/.kube/config when ``path`` is None).

    A file that is missing, is not YAML or lacks the context raises KubeConfigError naming the file.
    """
    files = kubeconfig_files(path)
    check_kubeconfig(files, context)
    where = os.pathsep.join(str(f) for f in files)
    cfg = k8s.Configuration()
    try:
        with translate():
            await k8s_config.load_kube_config(config_file=where, context=context, client_configuration=cfg,
                                              persist_config=False)
    except (ConfigException, yaml.YAMLError) as exc:
        # The library's text names the missing key or context, never credentials.
        raise KubeConfigError(f"cannot use the kubeconfig {where}: {_one_line(str(exc))}; pass --kubeconfig FILE "
                              f"(and --context NAME)") from None
    except OSError as exc:
        raise KubeConfigError(f"cannot read the kubeconfig {where}: {exc.strerror or type(exc).__name__}; "
                              f"pass --kubeconfig FILE") from None
    ns = namespace or _kubeconfig_namespace(files, context) or "default"
    return _build(cfg, ns, (timing or Timing.from_env()).kube_call_timeout, trust)


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


def _kubeconfig_namespace(files: Sequence[Path], context: str | None) -> str | None:
    """The context's namespace (kubernetes-asyncio does not expose it)."""
    docs = []
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    name = context or next((d["current-context"] for d in docs if d.get("current-context")), None)
    for doc in docs:
        for ctx in doc.get("contexts") or []:
            if isinstance(ctx, dict) and ctx.get("name") == name:
                ns = (ctx.get("context") or {}).get("namespace")
                return str(ns) if ns else None
    return None
