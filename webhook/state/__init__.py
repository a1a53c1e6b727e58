"""Cluster state for admission: the StateBackend interface and the embedded back end."""
