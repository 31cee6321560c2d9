"""pykubelet: a node agent that runs Kubernetes pods the way the kubelet does."""

__version__ = "0.1.0"
