"""The server's Ed25519 key, which signs every job message: made on first
use under var/ (embedded default) or read from TILEMATRIX_SERVER_KEY_FILE.
Runners learn its public half at registration (``runners.signing``
verifies with it)."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from runners.signing import key_load_or_create, public_key_hex


def key_path() -> Path:
    return Path(
        os.environ.get("TILEMATRIX_SERVER_KEY_FILE")
        or Path(settings.VAR_DIR) / "server_ed25519.key"
    )


_keys: dict[Path, Ed25519PrivateKey] = {}


def server_key() -> Ed25519PrivateKey:
    """The server's signing key, made on first use (embedded default) or
    read from TILEMATRIX_SERVER_KEY_FILE."""
    path = key_path()
    if path not in _keys:
        _keys[path] = key_load_or_create(path)
    return _keys[path]


def server_public_key() -> str:
    return public_key_hex(server_key())
