"""fracgpu core: the vocabulary every component speaks.

Read in this order:

- ``names``     resource names, annotation/label keys, reserved variables, shim file ABI paths
- ``errors``    the typed errors; every message names what was wrong and what is allowed
- ``quantity``  exact Kubernetes resource quantities (``"500m"``, ``"2Gi"``...)
- ``model``     frozen dataclasses: devices, nodes, requests, assignments, reservations, quotas
- ``dialects``  TKEStack / HAMi / gpushare container resources -> one canonical request
- ``codec``     the only place that turns the model into versioned JSON and back
- ``shim_abi``  the limits file and shared accounting region shared with the C shim
- ``placement`` the pure placement function shared by the webhook and the trace benchmark

The package does no I/O and imports none of the components (enforced by import-linter).
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, every command prints it
