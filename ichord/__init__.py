"""ichord: keeps Talos Linux clusters' certificate authorities and configuration safe."""

__version__ = "0.1.0"
