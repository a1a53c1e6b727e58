"""fracgpu certs: the webhook's CA and serving certificate, kept in Secrets, with the caBundle
patched into the webhook configurations and rotated before expiry (docs/certificates.md).

Modules: authority (keys, certificates, PEM), policy (what to do), store (Kubernetes),
reconcile (read-decide-write with conflict retries), files (certificate files on disk),
settings (all configuration), cli (`fracgpu-certs`).
"""
