"""The users the test apiserver knows, authenticated by static bearer tokens."""

from __future__ import annotations

import csv
import io
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

WEBHOOK_NAMESPACE = "fracgpu-system"


@dataclass(frozen=True)
class Identity:
    """One user: the apiserver maps `token` to `user` with `groups`."""

    key: str
    user: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(24), repr=False)


def _service_account(key: str, name: str) -> Identity:
    # Same user and group names a real service-account token would authenticate as, so
    # RBAC bindings written for the chart's ServiceAccounts apply unchanged.
    return Identity(
        key=key,
        user=f"system:serviceaccount:{WEBHOOK_NAMESPACE}:{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{WEBHOOK_NAMESPACE}"),
    )


def default_identities() -> tuple[Identity, ...]:
    return (
        # system:masters bypasses RBAC: the test driver's own account.
        Identity(key="admin", user="e2e-admin", groups=("system:masters",)),
        _service_account("webhook", "fracgpu-webhook"),
        _service_account("agent", "fracgpu-agent"),
        # Plain users with no rights until a test binds a role to them.
        Identity(key="tenant", user="tenant-alice", groups=("tenants",)),
        Identity(key="tenant2", user="tenant-bob", groups=("tenants",)),
    )


DEFAULT_IDENTITIES: tuple[str, ...] = tuple(i.key for i in default_identities())


def token_file(identities: Iterable[Identity]) -> str:
    """The --token-auth-file format: token,user,uid,"group1,group2"."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for identity in identities:
        writer.writerow([identity.token, identity.user, identity.user, ",".join(identity.groups)])
    return out.getvalue()
