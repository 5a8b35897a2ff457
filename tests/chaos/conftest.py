"""The chaos tier's fixtures: the e2e tier's simulated environments (a whole cluster per test), and the e2e
rotation's world (``env``: a separate management API with the kube-system clients; ``kube``: its client)."""

from tests.e2e.conftest import e2e_bundle, make_sim_env
from tests.e2e.test_ca_rotation_daemon import env, kube

__all__ = ["e2e_bundle", "env", "kube", "make_sim_env"]
