"""A throwaway CA and serving certificate for the demo and tests.

The certificates themselves come from the certs component (``certs.authority``); this
module only adapts them to what a local HTTPS server and its client need: PEM bytes, the
serial number (to tell certificates apart in reload tests) and files on disk.
"""

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from certs.authority import CertKeyPair, new_ca
from certs.authority import issue_serving as issue_signed


@dataclass(frozen=True)
class Authority:
    pair: CertKeyPair

    @property
    def cert_pem(self) -> bytes:
        return self.pair.cert_pem()


@dataclass(frozen=True)
class ServingPair:
    cert_pem: bytes
    key_pem: bytes
    serial: int


def new_authority(days: int = 1) -> Authority:
    now = datetime.datetime.now(datetime.UTC)
    return Authority(new_ca(now, datetime.timedelta(days=days)))


def issue_serving(
    authority: Authority, hosts: Sequence[str] = ("localhost", "127.0.0.1"), days: int = 1
) -> ServingPair:
    """A server certificate for ``hosts`` (DNS names or IP addresses) signed by ``authority``."""
    dns_names, ip_addresses = [], []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
            ip_addresses.append(host)
        except ValueError:
            dns_names.append(host)
    now = datetime.datetime.now(datetime.UTC)
    pair = issue_signed(
        authority.pair, dns_names or ["localhost"], now, datetime.timedelta(days=days),
        ip_addresses,
    )  # fmt: skip
    return ServingPair(pair.cert_pem(), pair.key_pem(), pair.cert.serial_number)


def write_files(
    directory: Path, authority: Authority, pair: ServingPair
) -> tuple[Path, Path, Path]:
    """(CA, certificate, key) files; the key is readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, cert, key = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    ca.write_bytes(authority.cert_pem)
    cert.write_bytes(pair.cert_pem)
    key.touch(mode=0o600)
    key.write_bytes(pair.key_pem)
    return ca, cert, key
