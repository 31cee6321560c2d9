"""The read-only HTTP API, the status page, and how pods are shown to people."""
