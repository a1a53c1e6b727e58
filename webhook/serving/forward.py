"""Forwarding an admission review to the leader replica (cluster mode: only it places pods).

The review goes as it came, over HTTPS, with a header naming the forwarding replica: a
replica that receives a forwarded review and cannot place answers itself (fail closed)
instead of forwarding again, so reviews never loop. Every replica serves the certificate of
one Secret, so the leader must present exactly the certificate this replica serves
(pinned by its SHA-256); after a rotation the pin is read again.
"""

import hashlib
import json
import logging
import ssl
from pathlib import Path
from typing import Final

import aiohttp

log = logging.getLogger(__name__)

FORWARDED_BY_HEADER: Final = "X-Fracgpu-Forwarded-By"
# Well under the API server's webhook timeout (the chart's default is 10 s).
FORWARD_TIMEOUT_S: Final = 5.0


class ForwardError(Exception):
    """The leader gave no usable answer; the message says what happened."""


def certificate_fingerprint(cert_file: Path) -> bytes:
    """SHA-256 of the first (leaf) certificate of a PEM chain, in DER form."""
    pem = cert_file.read_text()
    end_marker = "-----END CERTIFICATE-----"
    leaf = pem[: pem.index(end_marker) + len(end_marker)]
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(leaf)).digest()


class LeaderForwarder:
    def __init__(self, cert_file: Path, identity: str) -> None:
        self._cert_file = cert_file
        self._identity = identity
        self._session: aiohttp.ClientSession | None = None
        # One object per pin: aiohttp pools connections by it, so a new one per request
        # would open (and keep) a new TLS connection per forwarded review.
        self._pin: aiohttp.Fingerprint | None = None

    async def forward(self, url: str, body: bytes, uid: str) -> bytes:
        """The leader's review response to ``body`` (checked to answer ``uid``)."""
        try:
            return await self._post(url, body, uid)
        except aiohttp.ServerFingerprintMismatch:
            self._pin = None  # the certificate may have been rotated: read the pin again, once
        try:
            return await self._post(url, body, uid)
        except aiohttp.ServerFingerprintMismatch:
            raise ForwardError(
                f"the leader at {url} does not present this replica's certificate"
            ) from None

    async def relay(self, url: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The leader's answer to an extender call (``webhook.queue.extender``), over the
        same pinned connection as forwarded reviews."""
        try:
            return await self._send(url, body, headers)
        except aiohttp.ServerFingerprintMismatch:
            self._pin = None
        try:
            return await self._send(url, body, headers)
        except aiohttp.ServerFingerprintMismatch:
            raise ForwardError(
                f"the leader at {url} does not present this replica's certificate"
            ) from None

    async def _post(self, url: str, body: bytes, uid: str) -> bytes:
        payload = await self._send(url, body, {})
        try:
            answered = json.loads(payload)["response"]["uid"]
        except (ValueError, KeyError, TypeError):
            raise ForwardError(f"the leader at {url} answered no admission review") from None
        if answered != uid:
            raise ForwardError(f"the leader at {url} answered another request ({answered!r})")
        return payload

    async def _send(self, url: str, body: bytes, extra: dict[str, str]) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)
            )
        if self._pin is None:
            self._pin = aiohttp.Fingerprint(certificate_fingerprint(self._cert_file))
        headers = {
            "Content-Type": "application/json",
            FORWARDED_BY_HEADER: self._identity,
            **extra,
        }
        try:
            async with self._session.post(url, data=body, headers=headers, ssl=self._pin) as answer:
                payload = await answer.read()
                status = answer.status
        except aiohttp.ServerFingerprintMismatch:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise ForwardError(f"the leader at {url} did not answer: {error!r}") from None
        if status != 200:
            raise ForwardError(f"the leader at {url} answered HTTP {status}")
        return payload

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
