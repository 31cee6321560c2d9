"""Per-pod work: the workers, one sync of a pod against the runtime, back-off, environment and
volumes.
"""
