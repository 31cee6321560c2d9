"""The core the docker and CRI backends share: the Runtime protocol over a narrow engine
protocol (engine.py), its status cache, views, and the names both derive from a pod.
"""
