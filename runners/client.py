"""The runner host's HTTP client for the server's API (stdlib only): plain
JSON posts for registration and uploads, and signed requests for what a
runner worker asks while it works (claims, recovery, its outbox, its
queues). A runner worker holds no database credentials: this is its only
way to the server's state besides the broker."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from runners import protocol

API = "/api/v1"
# Statuses that say "not now" rather than "no": the request may be sent again.
TRANSIENT = {408, 425, 429}
# The server refuses bodies over Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB
# by default): result uploads go in batches well under it.
UPLOAD_BATCH_BYTES = 1_000_000


class ServerUnavailable(ConnectionError):
    """The server could not be reached or failed to answer (timeout, 5xx):
    the request may succeed later."""


class ServerRefused(RuntimeError):
    """The server answered the request with a refusal (4xx)."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"refused ({status}): {detail}")
        self.status, self.detail = status, detail


def server_url(text: str) -> str:
    """A server's base URL, without its trailing slash. ValueError unless it
    is http(s) with a host: urllib would also try ftp: (and wait a minute
    for an answer that never comes) or read a file: URL from the disk."""
    try:
        parts = urllib.parse.urlsplit(text.strip())
    except ValueError:  # an unclosed "[" of an IPv6 address
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--server takes an http(s) URL like https://tilematrix.example; "
            f"got {text!r}"
        )
    return text.strip().rstrip("/")


def upload_batches(envelopes: list, limit: int = UPLOAD_BATCH_BYTES) -> list[range]:
    """Consecutive index ranges of ``envelopes`` whose upload bodies stay
    under ``limit`` bytes, sized by the JSON each envelope sends. An
    envelope larger than that goes alone, for the server to judge."""
    batches, start, size = [], 0, 0
    for i, envelope in enumerate(envelopes):
        length = len(json.dumps(envelope).encode()) + 2  # with its ", "
        if i > start and size + length > limit:
            batches.append(range(start, i))
            start, size = i, 0
        size += length
    if envelopes:
        batches.append(range(start, len(envelopes)))
    return batches


def post_json(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    """POST a JSON body; (status, JSON reply). ServerUnavailable when the
    server cannot be reached or does not answer within ``timeout``."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {"detail": exc.reason}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        # ValueError: a reply that is not JSON (a proxy's error page).
        raise ServerUnavailable(f"cannot reach {url}: {exc}") from None


def problem(reply: dict) -> str:
    """The reason in an error reply, schema errors included."""
    detail = reply.get("detail") if isinstance(reply, dict) else reply
    if isinstance(detail, list):  # schema errors
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}"
            for d in detail
            if isinstance(d, dict)
        )
    return str(detail or reply)


def signed_request(config, kind: str, timeout: float = 30, **fields) -> dict:
    """Sign a request of ``kind`` with the runner's key, post it to
    ``/api/v1/runners/<kind>`` on the server it registered with, and return
    the reply. ServerUnavailable when it may be tried again later,
    ServerRefused when the server said no."""
    envelope = protocol.request_envelope(
        kind=kind, runner_name=config.name, key=config.key, **fields
    )
    url = f"{config.server.rstrip('/')}{API}/runners/{kind}"
    status, reply = post_json(url, envelope, timeout=timeout)
    if status == 200:
        return reply
    if status >= 500 or status in TRANSIENT:
        raise ServerUnavailable(f"{url} answered {status}: {problem(reply)}")
    raise ServerRefused(status, problem(reply))
