"""Real TLS on loopback: a server with an issued certificate, a client that trusts only the CA
(or the caBundle) and checks the host name, as kube-apiserver does when calling the webhook."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from certs import authority
from certs.authority import CertKeyPair
from certs.settings import Settings


def _now() -> datetime:
    # The TLS stacks check validity against the real clock, so these tests use it too.
    return datetime.now(UTC)


@asynccontextmanager
async def _tls_server(pair: CertKeyPair, directory: Path) -> AsyncIterator[int]:
    """An echo server on 127.0.0.1 presenting `pair`; yields its port."""
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(pair.cert_pem())
    key_file.write_bytes(pair.key_pem())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            writer.write(b"echo " + line)
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass  # a client that refused our certificate hangs up mid-handshake
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _talk(port: int, trusted: Sequence[CertKeyPair | bytes], hostname: str) -> bytes:
    """Connect trusting only `trusted` CAs, verifying `hostname`; returns the echo."""
    pem = b"".join(t if isinstance(t, bytes) else t.cert_pem() for t in trusted)
    context = ssl.create_default_context(cadata=pem.decode())
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=hostname
    )
    try:
        writer.write(b"ping\n")
        await writer.drain()
        return await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_client_trusting_only_the_ca_accepts_every_service_name(
    settings: Settings, tmp_path: Path
) -> None:
    ca = authority.new_ca(_now(), timedelta(days=30))
    serving = authority.issue_serving(ca, settings.dns_names, _now(), timedelta(days=1))
    assert len(settings.dns_names) == 4
    async with _tls_server(serving, tmp_path) as port:
        for name in settings.dns_names:
            assert await _talk(port, [ca], name) == b"echo ping\n"


async def test_a_name_not_in_the_certificate_is_refused(settings: Settings, tmp_path: Path) -> None:
    ca = authority.new_ca(_now(), timedelta(days=30))
    serving = authority.issue_serving(ca, settings.dns_names, _now(), timedelta(days=1))
    async with _tls_server(serving, tmp_path) as port:
        for wrong in ("fracgpu-webhook.other.svc", "other.gpu-system.svc", "127.0.0.1"):
            with pytest.raises(ssl.SSLCertVerificationError, match=r"mismatch|doesn.t match"):
                await _talk(port, [ca], wrong)


async def test_a_certificate_with_wrong_sans_is_refused(tmp_path: Path) -> None:
    stale = Settings(namespace="old-namespace", service="fracgpu-webhook")
    ca = authority.new_ca(_now(), timedelta(days=30))
    serving = authority.issue_serving(ca, stale.dns_names, _now(), timedelta(days=1))
    async with _tls_server(serving, tmp_path) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match=r"mismatch|doesn.t match"):
            await _talk(port, [ca], "fracgpu-webhook.gpu-system.svc")


async def test_an_expired_certificate_is_refused(settings: Settings, tmp_path: Path) -> None:
    then = _now() - timedelta(days=10)
    ca = authority.new_ca(then, timedelta(days=30))
    serving = authority.issue_serving(ca, settings.dns_names, then, timedelta(days=2))
    async with _tls_server(serving, tmp_path) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
            await _talk(port, [ca], "fracgpu-webhook.gpu-system.svc")


async def test_a_certificate_from_another_ca_is_refused(settings: Settings, tmp_path: Path) -> None:
    ca = authority.new_ca(_now(), timedelta(days=30))
    stranger = authority.new_ca(_now(), timedelta(days=30))
    serving = authority.issue_serving(stranger, settings.dns_names, _now(), timedelta(days=1))
    async with _tls_server(serving, tmp_path) as port:
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            await _talk(port, [ca], "fracgpu-webhook.gpu-system.svc")


async def test_an_ip_san_lets_a_client_dial_the_address(tmp_path: Path) -> None:
    local = Settings(namespace="gpu-system", extra_ip_addresses=("127.0.0.1",))
    ca = authority.new_ca(_now(), timedelta(days=30))
    serving = authority.issue_serving(
        ca, local.dns_names, _now(), timedelta(days=1), local.extra_ip_addresses
    )
    async with _tls_server(serving, tmp_path) as port:
        assert await _talk(port, [ca], "127.0.0.1") == b"echo ping\n"


async def test_the_overlap_bundle_trusts_old_and_new_serving_certificates(
    settings: Settings, tmp_path: Path
) -> None:
    """During CA rotation the caBundle holds both CAs: replicas serving either cert work."""
    old_ca = authority.new_ca(_now(), timedelta(days=30))
    new_ca = authority.new_ca(_now() + timedelta(seconds=1), timedelta(days=30))
    bundle = authority.encode_certs([new_ca.cert, old_ca.cert])
    old = authority.issue_serving(old_ca, settings.dns_names, _now(), timedelta(days=1))
    new = authority.issue_serving(new_ca, settings.dns_names, _now(), timedelta(days=1))
    name = "fracgpu-webhook.gpu-system.svc"
    for index, serving in enumerate((old, new)):
        directory = tmp_path / str(index)
        directory.mkdir()
        async with _tls_server(serving, directory) as port:
            assert await _talk(port, [bundle], name) == b"echo ping\n"
    # After the old CA is dropped, a replica still serving the old cert would be refused:
    # which is why it is dropped only after the overlap.
    async with _tls_server(old, tmp_path) as port:
        with pytest.raises(ssl.SSLCertVerificationError):
            await _talk(port, [new_ca], name)
