"""Errors of the certs component; every message says what was wrong and what is allowed."""

from fracgpu.errors import FracgpuError


class CertsError(FracgpuError):
    """Base of every error the certs component raises."""


class CertificateError(CertsError):
    """PEM data that cannot be read, or a certificate/key that does not fit its role."""


class SettingsError(CertsError):
    """A setting (flag or environment variable) with a value that is not allowed."""


class StoreError(CertsError):
    """The Kubernetes API refused a read or write for a reason other than a conflict."""


class StoreConflictError(CertsError):
    """Someone else changed an object between our read and our write (HTTP 409)."""
