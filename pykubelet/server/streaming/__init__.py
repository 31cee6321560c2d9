"""Streaming for kubectl exec, attach and port-forward: upgraded connections, SPDY/3.1."""
