"""Simulators that speak the real wire protocols (Kubernetes REST over HTTPS, Talos gRPC over mTLS)."""
