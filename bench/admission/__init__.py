"""Admission latency budget: empty TLS handler vs. /mutate vs. pod creates via kube-apiserver."""
