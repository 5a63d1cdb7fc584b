from __future__ import annotations

import copy
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matrix.fleet import keys
from runners import signing

from .conftest import resigned


@pytest.fixture
def key():
    return Ed25519PrivateKey.generate()


def test_a_signed_envelope_verifies_and_returns_its_payload(key):
    envelope = signing.envelope_sign(payload={"job": 1}, signer="cpu-1", key=key)
    assert set(envelope) == {"payload", "signer", "nonce", "issued_at", "signature"}
    public = signing.public_key_hex(key)
    assert signing.envelope_verify(envelope, public_key=public) == {"job": 1}


@pytest.mark.parametrize(
    "field, value",
    [
        ("payload", {"job": 2}),
        ("signer", "cpu-2"),
        ("nonce", "0" * 32),
        ("issued_at", "2020-01-01T00:00:00+00:00"),
    ],
)
def test_it_refuses_an_envelope_altered_after_signing(key, field, value):
    envelope = signing.envelope_sign(payload={"job": 1}, signer="cpu-1", key=key)
    altered = copy.deepcopy(envelope)
    altered[field] = value
    with pytest.raises(signing.EnvelopeError, match="bad signature"):
        signing.envelope_verify(altered, public_key=signing.public_key_hex(key))


def test_it_refuses_an_envelope_signed_by_another_key(key):
    forged = signing.envelope_sign(
        payload={"job": 1}, signer="cpu-1", key=Ed25519PrivateKey.generate()
    )
    with pytest.raises(signing.EnvelopeError, match="bad signature"):
        signing.envelope_verify(forged, public_key=signing.public_key_hex(key))


def well_formed(**changes) -> dict:
    """An envelope whose fields have the right shapes (not a valid signature)."""
    return {
        "payload": {},
        "signer": "a",
        "nonce": "b" * 32,
        "issued_at": "c",
        "signature": "d" * 128,
        **changes,
    }


@pytest.mark.parametrize(
    "envelope, reason",
    [
        ("text", "JSON object"),
        ({"payload": {}}, "missing"),
        (well_formed(payload=[]), "payload must be an object"),
        (well_formed(signature="zz"), "signature must be 128 lowercase hex"),
        (well_formed(nonce=7), "nonce must be a string"),
    ],
)
def test_it_names_what_is_wrong_with_a_malformed_envelope(key, envelope, reason):
    with pytest.raises(signing.EnvelopeError, match=reason):
        signing.envelope_verify(envelope, public_key=signing.public_key_hex(key))


@pytest.mark.parametrize(
    "nonce",
    ["a" * 5000, "a" * 31, "A" * 32, "a" * 31 + "\n", "a" * 30 + " a"],
    ids=["5000-chars", "31-chars", "capitals", "newline", "space"],
)
def test_it_refuses_a_correctly_signed_nonce_of_another_format(key, nonce):
    envelope = resigned(
        signing.envelope_sign(payload={}, signer="cpu-1", key=key), key, nonce=nonce
    )
    with pytest.raises(signing.EnvelopeError, match="nonce must be 32 lowercase hex"):
        signing.envelope_verify(envelope, public_key=signing.public_key_hex(key))


@pytest.mark.parametrize(
    "spell",
    [
        str.upper,
        lambda hex_text: " ".join(hex_text[i : i + 2] for i in range(0, 128, 2)),
        lambda hex_text: hex_text + "\n",
    ],
    ids=["capitals", "spaces", "newline"],
)
def test_it_refuses_a_true_signature_spelt_another_way(key, spell):
    envelope = signing.envelope_sign(payload={}, signer="cpu-1", key=key)
    envelope["signature"] = spell(envelope["signature"])
    with pytest.raises(signing.EnvelopeError, match="signature must be 128 lowercase"):
        signing.envelope_verify(envelope, public_key=signing.public_key_hex(key))


# The order of the Ed25519 group: S + L is the same point's scalar, so a
# verifier that does not insist on S < L takes two signatures for one
# envelope (RFC 8032, 5.1.7).
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493


def test_it_refuses_a_true_signature_made_malleable(key):
    """A replayed result with its signature's S moved by the group order
    would carry a fresh signature text past the receipt check."""
    envelope = signing.envelope_sign(payload={}, signer="cpu-1", key=key)
    raw = bytes.fromhex(envelope["signature"])
    s = int.from_bytes(raw[32:], "little") + GROUP_ORDER
    envelope["signature"] = (raw[:32] + s.to_bytes(32, "little")).hex()
    with pytest.raises(signing.EnvelopeError, match="bad signature"):
        signing.envelope_verify(envelope, public_key=signing.public_key_hex(key))


@pytest.mark.parametrize("public", ["ab" * 31, "zz" * 32], ids=["short", "not-hex"])
def test_it_names_a_signer_key_that_is_no_key(key, public):
    envelope = signing.envelope_sign(payload={}, signer="cpu-1", key=key)
    with pytest.raises(signing.EnvelopeError, match="public key is not a valid key"):
        signing.envelope_verify(envelope, public_key=public)


def test_it_refuses_an_envelope_older_than_the_limit(key, monkeypatch):
    monkeypatch.setattr(signing, "now_iso", lambda: "2020-01-01T00:00:00+00:00")
    old = signing.envelope_sign(payload={}, signer="cpu-1", key=key)
    with pytest.raises(signing.EnvelopeError, match="expired"):
        signing.envelope_verify(
            old, public_key=signing.public_key_hex(key), max_age_s=60
        )


def test_the_server_key_is_made_once_with_owner_only_permissions(tmp_path, monkeypatch):
    path = tmp_path / "keys" / "server.key"
    monkeypatch.setenv("TILEMATRIX_SERVER_KEY_FILE", str(path))
    first = keys.server_public_key()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    keys._keys.clear()
    assert keys.server_public_key() == first


def test_it_refuses_a_private_key_others_can_read(tmp_path, key):
    path = tmp_path / "runner.key"
    signing.key_write(path, key)
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        signing.key_read(path)
