"""The CA and serving certificates carry what TLS clients and kube-apiserver check."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import authority
from certs.errors import CertificateError
from certs.settings import Settings


def test_service_names_cover_every_form_a_client_may_use() -> None:
    assert authority.service_dns_names("hook", "gpu", "corp.example") == (
        "hook",
        "hook.gpu",
        "hook.gpu.svc",
        "hook.gpu.svc.corp.example",
    )


@pytest.mark.parametrize("bad", ["", "Hook", "hook_x", "-hook", "hook-", "a..b", "x" * 64])
def test_bad_dns_names_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(CertificateError, match="not a valid DNS name: allowed are"):
        authority.validate_dns_name(bad)


def test_ca_is_a_p256_ca_limited_to_leaf_certificates(t0: datetime) -> None:
    ca = authority.new_ca(t0, timedelta(days=10))
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert ca.key.curve.name == "secp256r1"
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert ca.cert.not_valid_before_utc == t0 - authority.BACKDATE
    assert ca.cert.not_valid_after_utc == t0 + timedelta(days=10)
    assert authority.is_signed_by(ca.cert, ca.cert)


def test_rotated_cas_have_distinct_subjects(t0: datetime) -> None:
    first = authority.new_ca(t0, timedelta(days=10))
    second = authority.new_ca(t0 + timedelta(seconds=1), timedelta(days=10))
    assert first.cert.subject != second.cert.subject
    assert not authority.is_signed_by(first.cert, second.cert)


def test_serving_certificate_is_for_server_auth_with_the_service_names(
    settings: Settings, t0: datetime
) -> None:
    ca = authority.new_ca(t0, timedelta(days=100))
    serving = authority.issue_serving(
        ca, settings.dns_names, t0, timedelta(days=30), ip_addresses=["127.0.0.1"]
    )
    cert = serving.cert
    assert authority.dns_names(cert) == set(settings.dns_names)
    assert authority.ip_addresses(cert) == {"127.0.0.1"}
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert authority.is_signed_by(cert, ca.cert)
    assert cert.issuer == ca.cert.subject
    assert cert.not_valid_after_utc == t0 + timedelta(days=30)
    assert authority.issued_at(cert) == t0


def test_serving_certificate_never_outlives_its_ca(settings: Settings, t0: datetime) -> None:
    ca = authority.new_ca(t0, timedelta(days=10))
    serving = authority.issue_serving(ca, settings.dns_names, t0, timedelta(days=365))
    assert serving.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def test_an_expired_ca_issues_nothing(settings: Settings, t0: datetime) -> None:
    ca = authority.new_ca(t0, timedelta(days=1))
    with pytest.raises(CertificateError, match="CA expired"):
        authority.issue_serving(ca, settings.dns_names, t0 + timedelta(days=2), timedelta(days=1))


def test_naive_time_and_non_positive_validity_are_refused(t0: datetime) -> None:
    with pytest.raises(CertificateError, match="timezone-aware"):
        authority.new_ca(t0.replace(tzinfo=None), timedelta(days=1))
    with pytest.raises(CertificateError, match="must be positive"):
        authority.new_ca(t0, timedelta(0))


def test_pem_round_trip_keeps_certificates_and_keys(settings: Settings, t0: datetime) -> None:
    ca = authority.new_ca(t0, timedelta(days=10))
    serving = authority.issue_serving(ca, settings.dns_names, t0, timedelta(days=5))
    again = authority.decode_pair(serving.cert_pem(), serving.key_pem())
    assert again.cert == serving.cert
    assert again.key_pem() == serving.key_pem()
    other = authority.new_ca(t0, timedelta(days=10))
    bundle = authority.encode_certs([ca.cert, other.cert])
    assert authority.decode_certs(bundle) == (ca.cert, other.cert)


def test_decoding_bad_pem_says_what_is_wrong(t0: datetime) -> None:
    ca = authority.new_ca(t0, timedelta(days=10))
    other = authority.new_ca(t0, timedelta(days=10))
    with pytest.raises(CertificateError, match="no PEM 'CERTIFICATE' block"):
        authority.decode_certs(b"hello")
    broken = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(CertificateError, match="not valid PEM certificates"):
        authority.decode_certs(broken)
    with pytest.raises(CertificateError, match="not an unencrypted PEM private key"):
        authority.decode_key(b"junk")
    with pytest.raises(CertificateError, match="does not belong to the certificate"):
        authority.decode_pair(ca.cert_pem(), other.key_pem())


def test_rsa_keys_stored_by_someone_else_are_readable(t0: datetime) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert isinstance(authority.decode_key(pem), rsa.RSAPrivateKey)
