"""Shared fixtures for the certs tests: settings and a fixed clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from certs.settings import Settings


@pytest.fixture
def settings() -> Settings:
    return Settings(namespace="gpu-system", service="fracgpu-webhook")


@pytest.fixture
def t0() -> datetime:
    """A fixed 'now' for pure tests; tests move it forward explicitly."""
    return datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
