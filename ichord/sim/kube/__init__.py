"""A Kubernetes API server simulator speaking the real REST wire over HTTPS (README.md, test tiers)."""

from ichord.sim.kube.behaviours import BehaviourSettings
from ichord.sim.kube.rest import WatchSettings
from ichord.sim.kube.server import KubeSimulator, SimSettings

__all__ = ["BehaviourSettings", "KubeSimulator", "SimSettings", "WatchSettings"]
