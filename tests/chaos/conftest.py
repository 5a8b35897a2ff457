"""The chaos tier's fixtures: the e2e tier's simulated environments (a whole cluster per test)."""

from tests.e2e.conftest import e2e_bundle, make_sim_env

__all__ = ["e2e_bundle", "make_sim_env"]
