"""Resource usage of the node, its pods and their containers (the kubelet's stats provider)."""
