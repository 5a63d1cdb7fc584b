"""Ed25519 envelopes for jobs (signed by the server) and heartbeats and
results (signed by a runner).

An envelope is ``{payload, signer, nonce, issued_at, signature}``. The
signature covers the canonical JSON of everything but itself, so changing
any field, the signer included, breaks it. This module knows no Django
models: callers look the signer's public key up themselves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

SERVER_SIGNER = "server"
ENVELOPE_FIELDS = {"payload", "signer", "nonce", "issued_at", "signature"}
# Exactly what envelope_sign makes: anything else did not come from a signer
# of this protocol. Exact, because the receipt columns have these widths and
# a stored receipt is matched by its nonce and signature as text (hex
# parsing alone would accept spaces and capitals).
NONCE_HEX_CHARS = 32
SIGNATURE_HEX_CHARS = 128
NONCE_FORMAT = re.compile(f"[0-9a-f]{{{NONCE_HEX_CHARS}}}")
SIGNATURE_FORMAT = re.compile(f"[0-9a-f]{{{SIGNATURE_HEX_CHARS}}}")


class EnvelopeError(ValueError):
    """An envelope that must not be trusted; the message says why."""


def canonical(data) -> bytes:
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def public_key_hex(private_key: Ed25519PrivateKey) -> str:
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return raw.hex()


def key_fingerprint(public_key: str) -> str:
    """A short, readable digest of a public key (hex), for a person to
    compare on two screens: SHA256 of the raw key, its first 16 bytes in
    groups of four hex digits."""
    digest = hashlib.sha256(bytes.fromhex(public_key)).hexdigest()[:32]
    return ":".join(digest[i : i + 4] for i in range(0, 32, 4))


def private_key_from_bytes(raw: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(raw)


def key_write(path: Path, private_key: Ed25519PrivateKey) -> None:
    """Write a raw private key readable by its owner only; the file is
    created 0600 so the key never exists with wider permissions, in a
    directory made 0700 when it is new."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    raw = private_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw.hex().encode())


def key_read(path: Path) -> Ed25519PrivateKey:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(
            f"{path} is readable by others (mode {mode:o}); chmod 600 it"
        )
    return private_key_from_bytes(bytes.fromhex(path.read_text().strip()))


def key_load_or_create(path: Path) -> Ed25519PrivateKey:
    if not path.exists():
        try:
            key_write(path, Ed25519PrivateKey.generate())
        except FileExistsError:
            pass  # another process made it first; read theirs
    return key_read(path)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def envelope_sign(*, payload: dict, signer: str, key: Ed25519PrivateKey) -> dict:
    body = {
        "payload": payload,
        "signer": signer,
        "nonce": secrets.token_hex(NONCE_HEX_CHARS // 2),
        "issued_at": now_iso(),
    }
    body["signature"] = key.sign(canonical(body)).hex()
    return body


def envelope_signer(envelope) -> str:
    """The claimed signer of an envelope, checked for shape only, so the
    caller can look up the key to verify it with."""
    if not isinstance(envelope, dict):
        raise EnvelopeError("an envelope must be a JSON object")
    missing = sorted(ENVELOPE_FIELDS - set(envelope))
    extra = sorted(set(envelope) - ENVELOPE_FIELDS)
    if missing or extra:
        raise EnvelopeError(
            f"malformed envelope: missing {missing}, unexpected {extra}"
        )
    for field in ("signer", "nonce", "issued_at", "signature"):
        if not isinstance(envelope[field], str) or not envelope[field]:
            raise EnvelopeError(f"malformed envelope: {field} must be a string")
    if not NONCE_FORMAT.fullmatch(envelope["nonce"]):
        raise EnvelopeError(
            f"malformed envelope: nonce must be {NONCE_HEX_CHARS} lowercase hex "
            "characters"
        )
    if not SIGNATURE_FORMAT.fullmatch(envelope["signature"]):
        raise EnvelopeError(
            f"malformed envelope: signature must be {SIGNATURE_HEX_CHARS} "
            "lowercase hex characters"
        )
    if not isinstance(envelope["payload"], dict):
        raise EnvelopeError("malformed envelope: payload must be an object")
    return envelope["signer"]


@functools.lru_cache(maxsize=1024)
def public_key_load(public_key: str) -> VerifyKey:
    """Parsed once per key: ingest verifies thousands of envelopes from the
    same few runners. Verified with libsodium (PyNaCl): 49 µs for a result's
    5 KB envelope where OpenSSL (cryptography) took 90 µs, the largest part
    of what the control worker spends on a result. Both follow RFC 8032, and
    libsodium also refuses non-canonical signatures and small-order keys,
    which no signer of this protocol makes."""
    return VerifyKey(bytes.fromhex(public_key))


def envelope_verify(
    envelope, *, public_key: str, max_age_s: float | None = None
) -> dict:
    """Return the payload of a correctly signed envelope, or raise
    EnvelopeError naming the problem."""
    envelope_signer(envelope)
    try:
        key = public_key_load(public_key)
    except ValueError:
        raise EnvelopeError("the signer's public key is not a valid key") from None
    signature = bytes.fromhex(envelope["signature"])
    body = {k: v for k, v in envelope.items() if k != "signature"}
    try:
        key.verify(canonical(body), signature)
    except BadSignatureError:
        raise EnvelopeError(
            f"bad signature: the envelope was not signed by {envelope['signer']!r} "
            "or was altered after signing"
        ) from None
    if max_age_s is not None:
        try:
            issued = datetime.fromisoformat(envelope["issued_at"])
        except ValueError:
            raise EnvelopeError(
                "malformed envelope: issued_at is not ISO 8601"
            ) from None
        if issued.tzinfo is None:
            raise EnvelopeError("malformed envelope: issued_at has no time zone")
        age = (datetime.now(UTC) - issued).total_seconds()
        if age > max_age_s:
            raise EnvelopeError(
                f"expired envelope: issued {age:.0f} s ago, limit {max_age_s:.0f} s"
            )
        if age < -300:
            raise EnvelopeError("envelope issued in the future: check the clocks")
    return envelope["payload"]
