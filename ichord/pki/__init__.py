"""Secrets bundle, CA generation, client certificates, fingerprints, rotation.yaml and the scrubber."""
