"""Timing scale and the elector's validated defaults (docs/decisions.md#rotation-state: 120/90/10 s)."""

from __future__ import annotations

import pytest

from ichord.leader import ElectionTiming, LeaderElectionConfigError
from ichord.settings import SettingsError, Timing


def test_defaults_are_the_adr_values_and_valid() -> None:
    t = ElectionTiming.from_timing(Timing())
    assert (t.lease_duration, t.renew_deadline, t.retry_period) == (120.0, 90.0, 10.0)
    assert t.call_timeout == 45.0  # max(renew deadline / 2, 1 s)
    assert Timing().kube_call_timeout < t.renew_deadline


@pytest.mark.parametrize(("lease", "renew", "retry"), [(90, 90, 10), (120, 12, 10), (120, 90, 0), (80, 90, 10)])
def test_invalid_orderings_are_refused(lease: float, renew: float, retry: float) -> None:
    with pytest.raises(LeaderElectionConfigError):
        ElectionTiming(lease, renew, retry, 1.0).validate()


def test_scale_applies_to_every_duration_of_the_world() -> None:
    scaled = Timing.from_env({"ICHORD_TIME_SCALE": "0.01"})
    assert scaled.lease_duration == pytest.approx(1.2)
    assert scaled.watch_inactivity_timeout == pytest.approx(0.7)
    # The bounds on one request are the wire's, not the world's: a scaled Timing keeps them load-tolerant (a
    # 0.3 s API call bound failed calls on a loaded machine, issue 32), and the elector still caps each renewal
    # by what is left of its (scaled) renew deadline.
    assert (scaled.kube_request_timeout, scaled.min_call_timeout) == (30.0, 5.0)
    assert scaled.kube_call_timeout == scaled.lease_call_timeout == pytest.approx(5.0)
    assert Timing().scaled(0.002).kube_call_timeout == pytest.approx(5.0)
    ElectionTiming.from_timing(scaled)  # still valid when scaled
    assert Timing.from_env({}) == Timing()
    with pytest.raises(SettingsError):
        Timing.from_env({"ICHORD_TIME_SCALE": "fast"})
    with pytest.raises(SettingsError):
        Timing().scaled(0)
