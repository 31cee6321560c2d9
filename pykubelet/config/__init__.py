"""The pod sources (file, http, apiserver) and the merger that turns them into one desired state."""
