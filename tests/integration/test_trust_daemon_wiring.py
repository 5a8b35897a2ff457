"""The daemon's trust wiring on the real wire: which client trusts the pool, the start-up API wait, the flags."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import anyio
import pytest
import structlog

from ichord.daemon import (
    LEGACY_TRUST_ROOT,
    APIUnavailableError,
    DaemonSettings,
    adopt_legacy_trust_file,
    build_pool,
    default_trust_file,
    make_client,
    wait_for_api,
)
from ichord.kube.client import from_kubeconfig
from ichord.kube.errors import TLSVerificationError
from ichord.kube.reads import read_config_map
from ichord.pki.ca import CAKind, generate_ca
from ichord.run_cli import register, settings_from_args
from ichord.settings import SettingsError
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.trust.pool import DEFAULT_TRUST_FILE

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


async def _root_ca(kube: object) -> bool:
    return bool((await read_config_map(kube, "default", "kube-root-ca.crt"))["data"])  # type: ignore[arg-type]


async def test_the_pool_is_the_clients_trust_with_a_kubeconfig_and_only_no_trust_pool_turns_it_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the per-kubeconfig trust file lives under ~/.ichord
    async with KubeSimulator(SimSettings(token="t")) as sim:
        kubeconfig = str(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        projected = tmp_path / "ca.crt"
        projected.write_bytes(sim.ca_pem)
        with_pool = DaemonSettings(kubeconfig=kubeconfig, ca_file=str(projected), namespace="default")
        plain = DaemonSettings(kubeconfig=kubeconfig, namespace="default")
        off = DaemonSettings(kubeconfig=kubeconfig, ca_file=str(projected), namespace="default", trust_pool=False)
        pools = {name: build_pool(s) for name, s in (("pool", with_pool), ("plain", plain), ("off", off))}
        clients = {name: await make_client(s, pools[name])
                   for name, s in (("pool", with_pool), ("plain", plain), ("off", off))}
        try:
            for c in clients.values():
                assert await _root_ca(c)
            new = generate_ca(CAKind.KUBERNETES)
            for pool in pools.values():
                pool.add(new.cert_pem)
            await sim.switch_serving_ca(new)
            # Trusted ahead of the switch: with --ca-file as the base, and with the kubeconfig's own CA (issue 12:
            # a plain `ichord run --kubeconfig` against an API server it can be rotated under must not lock out).
            assert await _root_ca(clients["pool"])
            assert await _root_ca(clients["plain"])
            with pytest.raises(TLSVerificationError):  # --no-trust-pool: the CA file alone
                await _root_ca(clients["off"])
            projected.write_bytes(new.cert_pem)  # the kubelet catches up: the CA file client follows
            assert await _root_ca(clients["off"])
        finally:
            for c in clients.values():
                await c.close()
    # The kubeconfig's inline CA is the base; the extras go to a file per kubeconfig that outlives the process.
    assert pools["plain"].has_base and pools["plain"].base is None
    assert pools["plain"].base_certificates()[0].subject == pools["pool"].base_certificates()[0].subject
    trust_file = plain.resolved_trust_file()
    assert trust_file is not None and trust_file.is_relative_to(tmp_path / ".ichord" / "trust")
    assert trust_file == DaemonSettings(kubeconfig=str(tmp_path / "." / "kubeconfig")).resolved_trust_file()
    assert DaemonSettings(kubeconfig=None).resolved_trust_file() == DEFAULT_TRUST_FILE
    assert DaemonSettings(kubeconfig="k", trust_file=str(tmp_path / "t")).resolved_trust_file() == tmp_path / "t"


async def test_the_api_wait_logs_at_most_once_per_interval_and_names_the_last_error(tmp_path: Path) -> None:
    async with KubeSimulator(SimSettings(token="t")) as sim:
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            await sim.go_down()
            with structlog.testing.capture_logs() as logs:
                start = time.monotonic()
                with pytest.raises(APIUnavailableError, match=r"did not answer within 0\.6 s; last error: .*"
                                                              r"unreachable"):
                    await wait_for_api(kube, give_up_after=0.6, log_interval=0.25, probe_interval=0.01)
                assert time.monotonic() - start < 2.0
            waits = [e for e in logs if e["event"] == "waiting for the Kubernetes API"]
            assert 2 <= len(waits) <= 3, waits  # ~50 failed probes, one line per 0.25 s
            assert sum(e["failed_probes_not_logged"] for e in waits) > 10

            async def back_soon() -> None:
                await anyio.sleep(0.2)
                await sim.come_up()

            async with anyio.create_task_group() as tg:
                tg.start_soon(back_soon)
                with structlog.testing.capture_logs() as logs:
                    await wait_for_api(kube, give_up_after=10, log_interval=5, probe_interval=0.02)
            assert [e["event"] for e in logs] == ["waiting for the Kubernetes API", "the Kubernetes API answers"]
        finally:
            await kube.close()


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)  # --kubeconfig defaults to it
    s = settings_from_args(_args("--kubeconfig", "k", "--ca-file", "ca.crt", "--trust-file", "t",
                                 "--trust-sync-tick", "3600"))
    assert (s.trust_pool, s.ca_file, s.trust_file, s.timing.trust_sync_tick) == (True, "ca.crt", "t", 3600.0)
    assert settings_from_args(_args("--kubeconfig", "k", "--no-trust-pool")).trust_pool is False
    with pytest.raises(SettingsError, match="--ca-file applies with --kubeconfig only"):
        settings_from_args(_args("--ca-file", "ca.crt"))
    with pytest.raises(SettingsError, match="positive"):
        settings_from_args(_args("--kubeconfig", "k", "--trust-sync-tick", "0"))


def test_a_trust_file_an_earlier_version_left_is_adopted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a completed rotation the file under ~/.ichor/trust holds the only CA the API server serves: an upgrade
    that moved the directory must carry it over, never start without it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    kubeconfig = str(tmp_path / "kubeconfig")
    legacy = default_trust_file(kubeconfig, root=LEGACY_TRUST_ROOT)
    legacy.parent.mkdir(parents=True)
    ca = generate_ca(CAKind.KUBERNETES)
    legacy.write_bytes(ca.cert_pem)
    settings = DaemonSettings(kubeconfig=kubeconfig)
    trust_file = settings.resolved_trust_file()
    assert trust_file is not None and not trust_file.exists() and trust_file != legacy
    adopt_legacy_trust_file(settings, trust_file)
    assert trust_file.read_bytes() == ca.cert_pem and legacy.exists()
    newer = generate_ca(CAKind.KUBERNETES)
    trust_file.write_bytes(newer.cert_pem)
    adopt_legacy_trust_file(settings, trust_file)  # once the new file exists, the old one never overwrites it
    assert trust_file.read_bytes() == newer.cert_pem
