"""The certificate authority: create a CA, issue the webhook's serving certificate, PEM I/O.

Pure functions: every one that depends on time takes an explicit `now`, so tests and the
policy control the clock. Keys are ECDSA P-256: small, fast to generate (the controller may
create them on every rotation), and accepted by every TLS stack that talks to a webhook
(Go's crypto/tls in kube-apiserver, OpenSSL, BoringSSL).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import CertificateError

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# Certificates start this long before `now`, so a peer whose clock is slightly behind still
# accepts a certificate issued a moment ago. The policy uses it to tell when one was issued.
BACKDATE = timedelta(minutes=5)

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class CertKeyPair:
    """A certificate with its private key (checked to match when decoded)."""

    cert: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def validate_dns_name(name: str) -> str:
    """The name if it is a valid lower-case DNS name (RFC 1123), else CertificateError."""
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise CertificateError(
            f"{name!r} is not a valid DNS name: allowed are dot-separated labels of 1-63 "
            "lower-case letters, digits and '-', not starting or ending with '-', 253 "
            "characters in all"
        )
    return name


def service_dns_names(service: str, namespace: str, cluster_domain: str) -> tuple[str, ...]:
    """The names a client may use for a Service: svc, svc.ns, svc.ns.svc, svc.ns.svc.<domain>."""
    names = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    )
    return tuple(validate_dns_name(name) for name in names)


def new_ca(now: datetime, validity: timedelta, name: str = "fracgpu-webhook-ca") -> CertKeyPair:
    """A self-signed CA that may sign leaf certificates only (path length 0).

    The subject carries the creation time so that rotated CAs have distinct names.
    """
    _require_aware(now)
    _require_positive(validity, "CA validity")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}@{int(now.timestamp())}")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKeyPair(cert=cert, key=key)


def issue_serving(
    ca: CertKeyPair,
    dns_names: Sequence[str],
    now: datetime,
    validity: timedelta,
    ip_addresses: Sequence[str] = (),
) -> CertKeyPair:
    """A TLS server certificate for `dns_names` (and optional IPs), signed by `ca`.

    It never outlives its CA: the end is clamped to the CA's notAfter.
    """
    _require_aware(now)
    _require_positive(validity, "serving certificate validity")
    if not dns_names:
        raise CertificateError("a serving certificate needs at least one DNS name")
    if now >= ca.cert.not_valid_after_utc:
        raise CertificateError(
            f"the CA expired at {ca.cert.not_valid_after_utc.isoformat()}: "
            "it can no longer issue certificates; create a new CA"
        )
    alt_names: list[x509.GeneralName] = [
        x509.DNSName(validate_dns_name(name)) for name in dns_names
    ]
    alt_names += [x509.IPAddress(_parse_ip(address)) for address in ip_addresses]
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + validity, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return CertKeyPair(cert=cert, key=key)


# --- inspection -----------------------------------------------------------------------


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER encoding, hex: the identity of a certificate."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def dns_names(cert: x509.Certificate) -> frozenset[str]:
    """The DNS subject alternative names (empty when the extension is absent)."""
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(extension.value.get_values_for_type(x509.DNSName))


def ip_addresses(cert: x509.Certificate) -> frozenset[str]:
    """The IP subject alternative names, as text."""
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(str(ip) for ip in extension.value.get_values_for_type(x509.IPAddress))


def is_signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether `issuer` issued `cert` (names match and the signature verifies)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def is_ca(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    return constraints.value.ca


def lifetime(cert: x509.Certificate) -> timedelta:
    """From issuance to notAfter: the span renewal windows are a share of (the backdating
    is clock-skew slack, not lifetime)."""
    return max(cert.not_valid_after_utc - issued_at(cert), timedelta(0))


def issued_at(cert: x509.Certificate) -> datetime:
    """When a certificate from this authority was issued (notBefore is backdated)."""
    return cert.not_valid_before_utc + BACKDATE


# --- PEM ------------------------------------------------------------------------------


def encode_certs(certs: Iterable[x509.Certificate]) -> bytes:
    """Concatenated PEM blocks, in order (a CA bundle)."""
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)


def decode_certs(pem: bytes, what: str = "certificate PEM") -> tuple[x509.Certificate, ...]:
    """Every certificate in a PEM bundle; CertificateError when there is none or one is bad."""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise CertificateError(f"{what}: no PEM 'CERTIFICATE' block found")
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as error:
        raise CertificateError(f"{what}: not valid PEM certificates ({error})") from error


def decode_key(pem: bytes, what: str = "private key PEM") -> PrivateKey:
    """An unencrypted EC or RSA private key (PKCS#8, SEC1 or PKCS#1 PEM)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateError(f"{what}: not an unencrypted PEM private key ({error})") from error
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(
            f"{what}: key type {type(key).__name__} is not supported: allowed are EC and RSA"
        )
    return key


def decode_pair(cert_pem: bytes, key_pem: bytes, what: str = "key pair") -> CertKeyPair:
    """The first certificate of `cert_pem` with its key; CertificateError if they differ."""
    cert = decode_certs(cert_pem, f"{what} certificate")[0]
    key = decode_key(key_pem, f"{what} key")
    if _public_der(cert.public_key()) != _public_der(key.public_key()):
        raise CertificateError(f"{what}: the private key does not belong to the certificate")
    return CertKeyPair(cert=cert, key=key)


def _public_der(public: object) -> bytes:
    if not isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        return b""
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError as error:
        raise CertificateError(f"{text!r} is not an IPv4 or IPv6 address") from error


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None:
        raise CertificateError("`now` must be timezone-aware (UTC), got a naive datetime")


def _require_positive(span: timedelta, what: str) -> None:
    if span <= timedelta(0):
        raise CertificateError(f"{what} must be positive, got {span}")
