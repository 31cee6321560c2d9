"""Liveness, readiness and startup probes, and the actions probes and lifecycle hooks run."""
