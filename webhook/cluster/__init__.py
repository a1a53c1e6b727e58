"""Cluster mode: the webhook's state kept in the Kubernetes API (watch caches, CAS stores)."""
