"""Cluster mode (--kubeconfig): the node, its Lease, mirror pods, events and final deletes in the
API server. Built by app.py only; nothing below it imports it.
"""
