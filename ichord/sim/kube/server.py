"""The simulated Kubernetes API server: lifecycle, HTTPS, faults, outages and the serving-CA switch."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from aiohttp import web

from ichord import yamlio
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca
from ichord.sim.kube import discovery, openapi, routes
from ichord.sim.kube.behaviours import BehaviourSettings, ClusterBehaviours
from ichord.sim.kube.certs import issue_serving_certificate, server_ssl_context
from ichord.sim.kube.clientauth import ClientCertAuth, ClientCertRejectedError, request_client_certificates
from ichord.sim.kube.faults import Access, Faults, RequestLog
from ichord.sim.kube.rest import Rest, WatchSettings, json_response
from ichord.sim.kube.status import ApiError, internal
from ichord.sim.kube.store import Store

DEFAULT_CRD_DIR = Path(__file__).resolve().parents[3] / "helm" / "ichord" / "files" / "crds"
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass
class SimSettings:
    host: str = "127.0.0.1"
    port: int = 0
    #: Retained watch events; a watch from before the window gets 410 Gone.
    window: int = 5000
    crd_dir: Path | None = DEFAULT_CRD_DIR
    #: Names and IPs in the serving certificate (besides the kube-apiserver defaults); None: ``host``.
    serving_hosts: tuple[str, ...] | None = None
    #: Bearer token clients must send; None accepts any client.
    token: str | None = None
    #: The user name ``token`` authenticates as (the request log's identity).
    token_user: str = "ichord-sim"  # noqa: S105  # a user name, not a secret
    #: More bearer tokens, each authenticating as its user (see ``KubeSimulator.add_user``).
    users: dict[str, str] = field(default_factory=dict)
    #: Client CAs for x509 authentication (kube-apiserver's --client-ca-file); None: no certificate asked.
    #: A certificate that does not chain to one gets 401; a request without one falls back to ``token``.
    client_cas: tuple[bytes, ...] | None = None
    watch: WatchSettings = field(default_factory=WatchSettings)
    behaviours: BehaviourSettings = field(default_factory=BehaviourSettings)


class KubeSimulator:
    """Start with ``async with KubeSimulator() as sim``; ``sim.url``, ``sim.ca_pem`` and ``sim.store``."""

    def __init__(self, settings: SimSettings | None = None, *, ca: CertificateAuthority | None = None) -> None:
        self.settings = settings or SimSettings()
        self.ca = ca or generate_ca(CAKind.KUBERNETES)
        self.store = Store(window=self.settings.window)
        self.faults = Faults()
        self.requests = RequestLog()
        self.rest = Rest(self.store, self.settings.watch)
        self.behaviours = ClusterBehaviours(self.store, self.settings.behaviours, self.ca)
        self.port = self.settings.port
        self.down = False
        #: Set when this server stands for one control plane's own address: anonymous /readyz answers its status
        #: (sim/combined/readyz.py); None answers nothing special.
        self.readyz: Callable[[], int | None] | None = None
        self._up_at: float | None = None  # when the server last came back up (faults.discovery_lag)
        self.client_auth = ClientCertAuth(self.settings.client_cas) if self.settings.client_cas is not None else None
        #: Client certificates refused (401): when, why, the certificate's subject.
        self.x509_failures: list[dict[str, object]] = []
        #: Outages and restarts of this API server (down, up, serving-CA switch), in order.
        self.outages: list[dict[str, object]] = []
        self._t0 = time.monotonic()
        self._runner: web.AppRunner | None = None
        self._ssl = self._ssl_context()
        for ns in SYSTEM_NAMESPACES:
            self.store.create(self.store.resolve("", "v1", "namespaces"), None, {"metadata": {"name": ns}})
        if self.settings.crd_dir is not None:
            self.load_crds(self.settings.crd_dir)

    # -- lifecycle ---------------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = server_ssl_context(issue_serving_certificate(self.ca, self._serving_hosts()))
        if self.client_auth is not None:
            request_client_certificates(ctx)
        return ctx

    def _record(self, kind: str, **data: object) -> None:
        self.outages.append({"at": round(time.monotonic() - self._t0, 6), "wall": time.time(), "kind": kind, **data})

    def set_client_cas(self, cas: tuple[bytes, ...]) -> None:
        """Accept client certificates from ``cas`` from now on (certificate auth must be on)."""
        if self.client_auth is None:
            raise RuntimeError("client-certificate authentication is off; set SimSettings.client_cas")
        self.client_auth.set_cas(cas)

    def add_user(self, token: str, user: str) -> None:
        """Accept ``token`` as a bearer token of ``user`` (recorded per request in ``requests.access``)."""
        self.settings.users[token] = user

    def _serving_hosts(self) -> list[str]:
        hosts = self.settings.serving_hosts
        return list(hosts) if hosts is not None else [self.settings.host]

    @property
    def url(self) -> str:
        return f"https://{self.settings.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """The certificate (never the key) of the CA that signs the serving certificate now."""
        return self.ca.cert_pem

    def load_crds(self, directory: Path) -> None:
        for path in sorted(directory.glob("*.yaml")):
            for doc in yamlio.load_all(path.read_text()):
                self.store.load_crd(json.loads(json.dumps(doc)))

    async def start(self) -> None:
        @web.middleware
        async def middleware(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
            return await self._middleware(request, handler)

        app = web.Application(middlewares=[middleware], client_max_size=8 << 20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.host, self.port))
        self.port = sock.getsockname()[1]
        site = web.SockSite(runner, sock, ssl_context=self._ssl)
        await site.start()
        self._runner = runner
        self.down = False
        self.behaviours.start()

    async def stop(self) -> None:
        await self.behaviours.stop()
        await self._shutdown()

    async def _shutdown(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> KubeSimulator:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # -- faults ------------------------------------------------------------------------------
    async def go_down(self) -> None:
        """Stop serving: new connections are refused and open ones are closed, like a restart."""
        self.down = True
        self._record("down")
        await self._shutdown()

    async def come_up(self) -> None:
        if self._runner is None:
            await self.start()
            self._up_at = time.monotonic()
            self._record("up")

    def _group_not_served_yet(self, group: str) -> bool:
        """A CRD's group during ``faults.discovery_lag`` after coming back up (built-in groups are served)."""
        lag = self.faults.discovery_lag
        if lag <= 0 or self._up_at is None or time.monotonic() - self._up_at >= lag:
            return False
        return "." in group and not group.endswith(".k8s.io")

    @asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        await self.go_down()
        try:
            yield
        finally:
            await self.come_up()

    async def switch_serving_ca(self, ca: CertificateAuthority) -> None:
        """Serve a certificate from ``ca`` from now on (the API server restarts to do it)."""
        self.ca = ca
        self._ssl = self._ssl_context()
        self.behaviours.serving_ca_changed(ca.cert_pem)
        self._record("serving_ca_switch", subject=ca.certificate.subject.rfc4514_string())
        running = self._runner is not None
        await self._shutdown()
        if running:
            await self.start()

    @property
    def open_watches(self) -> int:
        """Watch streams being served now."""
        return len(self.rest.open_watches)

    def drop_watches(self) -> None:
        """End every open watch abruptly (connection closed without the final chunk)."""
        for watcher in list(self.rest.open_watches):
            watcher.dropped.set()

    def stall_watches(self) -> None:
        """Leave every open watch connected but silent: no events, no bookmarks (a dead watch)."""
        for watcher in list(self.rest.open_watches):
            watcher.stalled = True

    def compact(self) -> None:
        """Forget all retained watch history: a watch from any older resourceVersion gets 410."""
        self.store.log.compact(self.store.rv)

    def write_kubeconfig(self, path: Path, *, namespace: str = "default", token: str | None = None) -> Path:
        path.write_bytes(self.kubeconfig_data(namespace=namespace, token=token))
        path.chmod(0o600)
        return path

    def kubeconfig_data(self, *, namespace: str = "default", token: str | None = None) -> bytes:
        """The kubeconfig ``write_kubeconfig`` writes, in memory."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "ichord-sim",
            "clusters": [{"name": "ichord-sim", "cluster": {
                "server": self.url,
                "certificate-authority-data": _b64(self.ca_pem)}}],
            "users": [{"name": "ichord-sim", "user": {"token": token or self.settings.token or "ichord-sim"}}],
            "contexts": [{"name": "ichord-sim", "context": {"cluster": "ichord-sim", "user": "ichord-sim",
                                                             "namespace": namespace}}],
        }
        return yamlio.dump(cfg).encode()

    # -- HTTP --------------------------------------------------------------------------------
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        route = routes.parse(request.method, request.path, dict(request.query))
        verb = route.verb if route else request.method.lower()
        resource = route.plural if route else ""
        if self.down:
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("simulated API server is down")
        if request.path == "/readyz" and self.readyz is not None:
            status = self.readyz()
            if status is None:  # a /readyz that never answers
                await asyncio.sleep(3600)
            return web.Response(status=status or 500, text="ok" if status == 200 else "[-]poststarthook failed")
        try:
            if self.faults.latency > 0:
                await asyncio.sleep(self.faults.latency)
            user = self._authenticate(request)
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if route is not None:  # what an authorizer would be asked, before the request is served
                self.requests.add_access(Access(
                    user=user, verb=verb, group=route.group, resource=resource, subresource=route.subresource or "",
                    namespace=route.namespace or "",
                    name=route.name or _selected_name(route.verb, request.query.get("fieldSelector", ""))))
            if route is not None and self.faults.denied:
                _refuse_if_denied(self.faults, user, verb, route)
            if self.faults.should_fail(verb, resource):
                code = self.faults.error_code
                reason = {503: "ServiceUnavailable", 429: "TooManyRequests", 409: "Conflict"}.get(code, "InternalError")
                raise ApiError(code, reason, self.faults.error_message or f"injected fault: {verb} failed")
            if route is not None and self._group_not_served_yet(route.group):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            reset = self.faults.should_reset(verb)
            if reset and not self.faults.reset_after:
                _reset(request)
            response = await handler(request)
            if reset:
                _reset(request)
        except ApiError as err:
            response = json_response(err.status(), err.code)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a simulator bug still answers like a server would
            bug = internal(f"{type(exc).__name__}: {exc}")
            response = json_response(bug.status(), bug.code)
        self.requests.add(verb, request.path, response.status, resource)
        return response

    def _authenticate(self, request: web.Request) -> str | None:
        """The user the request authenticates as (x509 CN, else its bearer token's), None when refused."""
        user = self._client_certificate_user(request)
        if user is None:
            auth = request.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
            if token is not None and token in self.settings.users:
                user = self.settings.users[token]
            elif self.settings.token is None or token == self.settings.token:
                user = self.settings.token_user if token is not None else "system:anonymous"
        return user

    def _client_certificate_user(self, request: web.Request) -> str | None:
        """The CN when a client certificate authenticated the request; 401 when one was sent and fails."""
        if self.client_auth is None or request.transport is None:
            return None
        ssl_object = request.transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is None:
            return None
        try:
            identity = self.client_auth.check(der)
        except ClientCertRejectedError as exc:
            self.x509_failures.append({"at": round(time.monotonic() - self._t0, 6), "wall": time.time(),
                                       "reason": str(exc), "path": request.path})
            raise ApiError(401, "Unauthorized", "Unauthorized") from None
        return identity.user

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        route = routes.parse(request.method, request.path, dict(request.query))
        if route is None:
            if request.method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            doc = (openapi.document(self.store, request.path)
                   or discovery.document(self.store, request.path, f"{self.settings.host}:{self.port}"))
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return json_response(doc)
        return await self.rest.handle(request, route)


def _selected_name(verb: str, field_selector: str) -> str:
    """kube-apiserver's request info names a list/watch by ``metadata.name=X`` in its field selector."""
    if verb not in ("list", "watch"):
        return ""
    for term in field_selector.split(","):
        key, _, value = term.partition("=")
        if key.strip() == "metadata.name":
            return value.removeprefix("=").strip()
    return ""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _refuse_if_denied(faults: Faults, user: str, verb: str, route: routes.Route) -> None:
    """403 for a request ``faults.denied`` lists, worded as kube-apiserver's RBAC refusal (NewForbidden around
    forbiddenMessage), which is what ichord.kube.forbidden reads back."""
    resource = f"{route.plural}/{route.subresource}" if route.subresource else route.plural
    namespace = route.namespace or ""
    if not faults.denies(verb, resource, namespace):
        return
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    qualified = f"{route.plural}.{route.group}" if route.group else route.plural
    subject = f'{qualified} "{route.name}"' if route.name else qualified
    raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                                     f'in API group "{route.group}"{where}',
                   {"name": route.name or "", "group": route.group, "kind": route.plural})


def _reset(request: web.Request) -> NoReturn:
    """Fault: drop the client's connection without an answer (as a load balancer or a crash would)."""
    if request.transport is not None:
        request.transport.abort()
    raise ConnectionResetError("injected fault: connection reset")
