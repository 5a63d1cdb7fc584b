"""What a worker takes from the broker is capped before it is inflated or
parsed: anyone holding broker credentials can publish to a queue, and a
60 KB zlib message once inflated to gigabytes in a control worker. A message
over the cap is refused as undecodable (the worker logs it, acknowledges it
and goes on); every message this project sends stays far below it.

Installed by the server's Celery app (``matrix/celery.py``) and the runner
agent's (``runners/app.py``): kombu's decoders are per process.
"""

from __future__ import annotations

import bz2
import lzma
import zlib

from kombu import compression, serialization

# The largest message either side sends: a job message of 25 signed jobs, or
# a result message of up to 50 signed results of about 6 KB each (with the
# kernel's source), is well under 1 MB. Sixteen times that is the cap.
MESSAGE_MAX_BYTES = 16 * 2**20


class MessageTooLarge(ValueError):
    """A broker message over MESSAGE_MAX_BYTES, raw or once inflated."""


def _capped(length: int, what: str) -> None:
    if length > MESSAGE_MAX_BYTES:
        raise MessageTooLarge(
            f"a broker message {what} over {MESSAGE_MAX_BYTES} bytes: refused"
        )


def _inflate(make_decompressor):
    """A decoder that inflates at most one byte past the cap, whatever the
    compressed body claims."""

    def inflate(body: bytes) -> bytes:
        _capped(len(body), "as sent")
        out = make_decompressor().decompress(body, max_length=MESSAGE_MAX_BYTES + 1)
        _capped(len(out), "once inflated")
        return out

    return inflate


def limits_install() -> None:
    """Replace kombu's decoders for this process with capped ones."""
    for content_type, decompressor, aliases in (
        ("application/x-gzip", zlib.decompressobj, ["zlib", "gzip"]),
        ("application/x-bz2", bz2.BZ2Decompressor, ["bzip2", "bzip"]),
        ("application/x-lzma", lzma.LZMADecompressor, ["lzma", "xz"]),
    ):
        encoder = compression._encoders[content_type]
        compression.register(encoder, _inflate(decompressor), content_type, aliases)
    registry = serialization.registry
    codec = registry._encoders["json"]
    loads = registry._decoders[codec.content_type]
    if getattr(loads, "capped", False):
        return  # installed already

    def capped_loads(body):
        _capped(len(body), "as sent")
        return loads(body)

    capped_loads.capped = True
    registry.register(
        "json",
        codec.encoder,
        capped_loads,
        content_type=codec.content_type,
        content_encoding=codec.content_encoding,
    )
