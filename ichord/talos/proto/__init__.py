"""Talos API sources (.proto) and the generated bindings (gen/)."""
