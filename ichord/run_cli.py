"""``ichord run``: the daemon. Settings from flags, then the environment (downward API), then defaults."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog

from ichord import gcpolicy, log, malloc
from ichord.api.max_unavailable import MaxUnavailable, MaxUnavailableError
from ichord.daemon import DaemonSettings, run_daemon
from ichord.errors import IchordError, network_cause
from ichord.kube.client import check_kubeconfig, kubeconfig_files
from ichord.leader import LeadershipLost
from ichord.operation_cli import LOG_LEVELS, log_level, namespace_name
from ichord.safefile import DestinationError, check_destination
from ichord.settings import DEPRECATED_CONCURRENCY_ENV, SettingsError, Timing


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the daemon (in-cluster, or against --kubeconfig)",
        description="Run ichord: informers on every replica, the cluster actors on the elected leader. "
        "ICHORD_TIME_SCALE scales every duration (tests and the demo); ICHORD_FAILPOINTS arms failpoints.",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig file (default: in-cluster service account)",
    )
    p.add_argument(
        "--controller-namespace",
        dest="namespace",
        type=namespace_name,
        default=os.environ.get("POD_NAMESPACE", "ichord-system"),
        help="controller namespace: the leader Lease (a TalosCluster's bundle Secret and lock Lease are in its own "
        "namespace; see --watch-namespace) (default $POD_NAMESPACE or %(default)s)",
    )
    # Deprecated spelling: elsewhere -n/--namespace names the TalosClusters' namespace, which `run` watches in all.
    p.add_argument("--namespace", dest="namespace", default=argparse.SUPPRESS, action=_DeprecatedNamespace,
                   help=argparse.SUPPRESS)
    p.add_argument("--identity", default=None, help="leader-election identity (default $POD_NAME or host_uuid)")
    p.add_argument("--metrics-addr", default="0.0.0.0:8080", help="host:port for /metrics /healthz /readyz")
    p.add_argument("--port-file", help="write the bound metrics port here (with port 0); an existing file is refused "
                   "unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing --port-file")
    p.add_argument("--resync", type=float, help="seconds between drift checks of a converged machine")
    p.add_argument("--certificate-expiry-warning-days", type=float, default=90.0,
                   help="CertificatesExpiring turns True this many days before a CA expires (default %(default)g; "
                   "keep it equal to the chart's prometheus.rules.certificateExpiryDays)")
    p.add_argument("--trust-file", default=None,
                   help="where the trust pool publishes the extra Kubernetes CAs (an emptyDir file; default "
                   "/var/run/ichord/trust/kubernetes-ca.crt in-cluster, ~/.ichord/trust/<kubeconfig digest>/"
                   "kubernetes-ca.crt with --kubeconfig)")
    p.add_argument("--ca-file", default=None,
                   help="with --kubeconfig: the trust pool's base CA file (re-read per request) instead of the "
                   "kubeconfig's own CA (e.g. a copy of a pod's ca.crt); without it the kubeconfig's CA is the base")
    p.add_argument("--no-trust-pool", dest="trust_pool", action="store_false",
                   help="do not trust a rotation's new Kubernetes CA ahead of the switch (the client then "
                   "fails x509 from Issuing until its CA file carries the new CA); for diagnosis only")
    p.add_argument("--trust-sync-tick", type=float, default=None,
                   help="seconds between the trust sync's fallback passes (default 10, scaled by "
                   "ICHORD_TIME_SCALE); tests set it high to show that events alone publish in time")
    p.add_argument("--allow-secret-namespace", action="append", default=[], metavar="NS", type=namespace_name,
                   help="a namespace, besides a TalosCluster's own, that its spec.secretsRef may name (repeat for "
                   "more); a reference elsewhere is refused (Ready=False/CrossNamespaceRefused), nothing is read")
    p.add_argument("--watch-namespace", action="append", default=[], metavar="NS", type=namespace_name,
                   help="a namespace, besides the controller namespace, where ichord is granted bundle Secrets and "
                   "lock Leases (repeat for more; the chart passes its watchNamespaces): its labelled bundle Secrets "
                   "are watched there, so a change wakes their cluster at once. TalosClusters of any namespace are "
                   "reconciled; where the grant is missing they say Ready=False/Forbidden, naming the chart value")
    p.add_argument("--max-unavailable", default=None, metavar="N|N%",
                   help="the workers a ca-rotation pass or a config rollout changes at once when neither the "
                   "TalosOperation nor its TalosCluster sets spec.maxUnavailable: a whole number of at least 1 or a "
                   "percentage of the cluster's workers (rounded down, at least 1), as Kubernetes' maxUnavailable; "
                   "control planes are always one at a time (default $ICHORD_MAX_UNAVAILABLE or 25%%)")
    p.add_argument("--log-level", type=log_level, default=os.environ.get("ICHORD_LOG_LEVEL", "info"),
                   help=f"one of {', '.join(LOG_LEVELS)} (default $ICHORD_LOG_LEVEL or info)")
    p.add_argument("--log-format", choices=("json", "console"), default="json")
    p.set_defaults(func=run)


class _DeprecatedNamespace(argparse.Action):
    """``run --namespace``: still accepted (older scripts and charts use it); ``run`` logs a warning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.deprecated_namespace_flag = True


def settings_from_args(args: argparse.Namespace) -> DaemonSettings:
    host, sep, port = str(args.metrics_addr).rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"--metrics-addr must be host:port with a port from 0 to 65535, got {args.metrics_addr!r}")
    if args.resync is not None and args.resync <= 0:
        raise SettingsError("--resync must be a positive number of seconds")
    if args.port_file:
        try:  # before anything starts; written atomically once the port is bound (daemon.py)
            check_destination(Path(args.port_file), force=args.force)
        except DestinationError as exc:
            raise SettingsError(f"--port-file: {exc}. Nothing was started.") from None
    settings = DaemonSettings(
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        metrics_host=host or "0.0.0.0",  # noqa: S104
        metrics_port=int(port),
        port_file=args.port_file,
        port_file_force=args.force,
        timing=Timing.from_env(),
        resync=args.resync,
        trust_pool=args.trust_pool,
        trust_file=args.trust_file,
        ca_file=args.ca_file,
        allowed_secret_namespaces=frozenset(args.allow_secret_namespace),
        watch_namespaces=frozenset(args.watch_namespace),
    )
    if args.trust_sync_tick is not None:
        if args.trust_sync_tick <= 0:
            raise SettingsError("--trust-sync-tick must be a positive number of seconds")
        settings.timing = dataclasses.replace(settings.timing, trust_sync_tick=args.trust_sync_tick)
    if args.max_unavailable is not None:
        try:
            bound = MaxUnavailable.parse_text(str(args.max_unavailable))
        except MaxUnavailableError as exc:
            raise SettingsError(str(exc)) from None
        settings.timing = dataclasses.replace(settings.timing, max_unavailable=bound)
    if args.ca_file and not args.kubeconfig:
        raise SettingsError("--ca-file applies with --kubeconfig only; in-cluster the service account's ca.crt "
                            "is the base")
    if args.certificate_expiry_warning_days < 0:
        raise SettingsError("--certificate-expiry-warning-days must be 0 or more")
    settings.certificate_expiry_warning_days = args.certificate_expiry_warning_days
    if args.identity:
        settings.identity = args.identity
    return settings


class AddressInUse(SettingsError):
    """--metrics-addr cannot be bound (taken by another process, or not an address of this host)."""


def check_listen_address(host: str, port: int) -> None:
    """Bind ``host:port`` once, as the health server will (SO_REUSEADDR, as aiohttp does), and let it go: a port
    another process listens on is refused here, in one line, before the daemon starts anything. (The server
    raises the same error should the port be taken between the two.)"""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise AddressInUse(f"--metrics-addr {host}:{port}: {network_cause(exc)}; pass a host:port of this "
                           "machine") from None
    for family, kind, proto, _name, addr in infos[:1]:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(addr)
            except OSError as exc:
                raise AddressInUse(listen_error(host, port, exc)) from None


def listen_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"--metrics-addr {host}:{port}: the port is already in use (another ichord run?); stop that "
                "process or pass another --metrics-addr")
    return f"--metrics-addr {host}:{port}: cannot listen there ({network_cause(exc)}); pass another --metrics-addr"


def deprecated_concurrency_env(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """True when the old ICHORD_CA_WORKER_APPLY_CONCURRENCY is what set the daemon's maxUnavailable."""
    return bool(environ.get(DEPRECATED_CONCURRENCY_ENV, "").strip()) and args.max_unavailable is None \
        and not environ.get("ICHORD_MAX_UNAVAILABLE", "").strip()


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    malloc.fix_mmap_threshold()  # idle memory: the TLS buffers of closed connections are returned (ichord.malloc)
    if settings.kubeconfig:
        # Before logging starts: a kubeconfig that cannot be used is one line naming the file, exit 2.
        check_kubeconfig(kubeconfig_files(settings.kubeconfig), None)
    check_listen_address(settings.metrics_host, settings.metrics_port)  # a taken port: one line, exit 2
    log.configure(args.log_level, json=args.log_format == "json")
    if getattr(args, "deprecated_namespace_flag", False):
        # Logged, not printed: the daemon's output is JSON lines that collectors parse.
        structlog.get_logger("ichord.run").warning(
            "`ichord run --namespace` is deprecated; use --controller-namespace", namespace=settings.namespace)
    if deprecated_concurrency_env(args, os.environ):
        structlog.get_logger("ichord.run").warning(
            f"{DEPRECATED_CONCURRENCY_ENV} is deprecated; use --max-unavailable or ICHORD_MAX_UNAVAILABLE",
            max_unavailable=str(settings.timing.max_unavailable))
    gcpolicy.tune()  # last before the loop: what start-up built is frozen, never walked again (ichord.gcpolicy)
    try:
        anyio.run(run_daemon, settings, backend="asyncio")
    except BaseException as exc:  # every way out of the task tree becomes one structured line and an exit code
        return exit_code_for(exc)
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def exit_code_for(exc: BaseException) -> int:
    """Log why the daemon stopped as one JSON line (never a plain traceback) and say how it exits.

    Leadership lost exits 1, as controller-runtime does, so the pod restarts and competes again; an error
    ichord names (the API never answered, a bad kubeconfig) exits 2; anything else is a bug: 1, with the
    traceback as a structured field.
    """
    leaves = _leaves(exc)
    logger = structlog.get_logger("ichord.run")
    if all(isinstance(e, KeyboardInterrupt) for e in leaves):
        return 130
    lost = [e for e in leaves if isinstance(e, LeadershipLost)]
    if lost:
        logger.error("leadership lost; exiting", cause=str(lost[0]), exit_code=LeadershipLost.exit_code)
        return LeadershipLost.exit_code
    named = [e for e in leaves if isinstance(e, IchordError)]
    if named and len(named) == len(leaves):
        logger.error("ichord run stopped", cause=str(named[0]), error_type=type(named[0]).__name__, exit_code=2)
        return 2
    unexpected = [e for e in leaves if not isinstance(e, IchordError | KeyboardInterrupt)]
    first = unexpected[0] if unexpected else leaves[0]
    logger.error("ichord run crashed", error_type=type(first).__name__, exc_info=first, exit_code=1)
    return 1
