"""The combined simulation: Talos nodes, their cluster's Kubernetes API and ichord's objects (``ichord sim``)."""

from ichord.sim.combined.env import SimEnvironment, SimEnvironmentError
from ichord.sim.combined.loopback import free_loopback_block

__all__ = ["SimEnvironment", "SimEnvironmentError", "free_loopback_block"]
