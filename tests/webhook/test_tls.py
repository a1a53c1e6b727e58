"""TLS: certificates come from files laid out like a Secret volume and reload without restart."""

import asyncio
import os
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from tests.webhook.support import cluster_state, gpu_pod, write_tls
from webhook import settings
from webhook.cli import selfsigned
from webhook.cli.client import WebhookClient, build_review, trusting
from webhook.serving import server
from webhook.serving.tls import CertificateReloader, TLSConfigError, TLSFiles, server_context


class SecretVolume:
    """kubelet's layout: tls.crt -> ..data/tls.crt, ..data -> ..<version>, swapped atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir()

    def publish(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.version += 1
        target = self.root / f"..v{self.version}"
        target.mkdir()
        (target / "tls.crt").write_bytes(cert_pem)
        (target / "tls.key").write_bytes(key_pem)
        staging = self.root / "..data_tmp"
        staging.symlink_to(target.name)
        os.replace(staging, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    @property
    def files(self) -> TLSFiles:
        return TLSFiles(self.root / "tls.crt", self.root / "tls.key")


async def peer_serial(port: int, context: ssl.SSLContext) -> int:
    """Open a fresh TLS connection and return the serial of the certificate the server sent."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.fixture
async def served(
    tmp_path: Path,
) -> AsyncIterator[tuple[SecretVolume, selfsigned.Authority, int, Path]]:
    authority = selfsigned.new_authority()
    volume = SecretVolume(tmp_path / "secret")
    first = selfsigned.issue_serving(authority)
    volume.publish(first.cert_pem, first.key_pem)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(authority.cert_pem)
    config = settings.from_mapping({"host": "127.0.0.1", "port": "0", "tls_reload_seconds": "0.05"})
    reloader = CertificateReloader(volume.files, config.tls_reload_seconds)
    running = await server.start(config, cluster_state(), reloader)
    try:
        yield volume, authority, running.port, ca
    finally:
        await running.stop()


async def wait_for_serial(port: int, context: ssl.SSLContext, serial: int) -> int:
    seen = 0
    for _ in range(100):
        seen = await peer_serial(port, context)
        if seen == serial:
            break
        await asyncio.sleep(0.02)
    return seen


async def test_new_connections_get_the_new_certificate_after_a_secret_swap(
    served: tuple[SecretVolume, selfsigned.Authority, int, Path],
) -> None:
    volume, authority, port, ca = served
    context = trusting(ca)
    old_serial = await peer_serial(port, context)
    # a connection opened before the swap keeps working through it
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    second = selfsigned.issue_serving(authority)
    assert second.serial != old_serial
    volume.publish(second.cert_pem, second.key_pem)
    assert await wait_for_serial(port, context, second.serial) == second.serial
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 200")
    writer.close()
    await writer.wait_closed()


async def test_a_mismatched_pair_keeps_the_old_certificate(
    served: tuple[SecretVolume, selfsigned.Authority, int, Path],
) -> None:
    volume, authority, port, ca = served
    context = trusting(ca)
    old_serial = await peer_serial(port, context)
    cert_only = selfsigned.issue_serving(authority)
    other_key = selfsigned.issue_serving(authority)
    volume.publish(cert_only.cert_pem, other_key.key_pem)
    await asyncio.sleep(0.3)
    assert await peer_serial(port, context) == old_serial
    # once a good pair lands, it is picked up
    good = selfsigned.issue_serving(authority)
    volume.publish(good.cert_pem, good.key_pem)
    assert await wait_for_serial(port, context, good.serial) == good.serial


async def test_admission_works_over_the_reloaded_certificate(
    served: tuple[SecretVolume, selfsigned.Authority, int, Path],
) -> None:
    volume, authority, port, ca = served
    fresh = selfsigned.issue_serving(authority)
    volume.publish(fresh.cert_pem, fresh.key_pem)
    assert await wait_for_serial(port, trusting(ca), fresh.serial) == fresh.serial
    async with WebhookClient(f"https://127.0.0.1:{port}", ca) as client:
        reply = await client.review("/mutate", build_review(gpu_pod({"nvidia.com/gpu": "1"})))
    assert reply.allowed


async def test_tls_below_1_2_is_refused_and_1_2_accepted(
    served: tuple[SecretVolume, selfsigned.Authority, int, Path],
) -> None:
    _, _, port, ca = served
    tls12 = trusting(ca)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert await peer_serial(port, tls12) > 0
    old = trusting(ca)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the point is to use it
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    # OpenSSL 3 offers TLS < 1.2 only at security level 0; without this the client itself
    # would give up, and the test would pass whatever the server allows. The client's
    # ability is proven in tests/security/test_webhook_transport.py.
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await peer_serial(port, old)


async def test_an_untrusted_client_cannot_connect(
    served: tuple[SecretVolume, selfsigned.Authority, int, Path], tmp_path: Path
) -> None:
    _, _, port, _ = served
    stranger = tmp_path / "stranger.crt"
    stranger.write_bytes(selfsigned.new_authority().cert_pem)
    with pytest.raises(ssl.SSLCertVerificationError):
        await peer_serial(port, trusting(stranger))


def test_the_server_context_requires_tls_1_2(tmp_path: Path) -> None:
    authority = selfsigned.new_authority()
    _, cert, key = selfsigned.write_files(tmp_path, authority, selfsigned.issue_serving(authority))
    context = server_context(TLSFiles(cert, key))
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


def test_missing_files_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match=r"TLS certificate file .*tls\.crt cannot be read"):
        server_context(TLSFiles(tmp_path / "tls.crt", tmp_path / "tls.key"))


def test_a_key_that_does_not_load_or_match_names_the_files_and_why(tmp_path: Path) -> None:
    # OpenSSL alone said "[SSL] PEM lib (_ssl.c:3926)" for a certificate given as the key.
    _, ca, cert, key = write_tls(tmp_path / "a")
    _, _, _, other_key = write_tls(tmp_path / "b")
    rsa_key = tmp_path / "rsa.key"
    rsa_key.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        serialization.load_pem_private_key(key.read_bytes(), None).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"secret")
        )
    )
    does_not_load = "does not load: it holds no PEM private key"
    cases = [
        (cert, ca, f"TLS key file {ca} {does_not_load} (-----BEGIN PRIVATE KEY-----) for the "),
        (cert, tmp_path / "nothing", f"TLS key file {tmp_path / 'nothing'} cannot be read: No "),
        (cert, other_key, f"TLS key file {other_key} does not match the certificate in {cert}"),
        (cert, rsa_key, f"TLS key file {rsa_key} does not match the certificate in {cert}"),
        (cert, locked, f"TLS key file {locked} does not load: it is encrypted"),
        (key, key, f"TLS certificate file {key} does not load: it holds no PEM certificate"),
    ]
    for cert_file, key_file, message in cases:
        with pytest.raises(TLSConfigError) as info:
            server_context(TLSFiles(cert_file, key_file))
        assert str(info.value).startswith(message), str(info.value)
        assert "PEM lib" not in str(info.value)
