"""The only code that talks to a Kubernetes API server: the typed client, retries, rate limits."""
