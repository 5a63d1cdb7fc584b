"""The two ways a message leaves: email through Django's mail framework
(whatever EMAIL_BACKEND names: SMTP in production, the console or a file
in the demo), and a webhook whose JSON body works as a Slack or Mattermost
incoming hook (it has ``text``), signed so the receiver can trust it.

Signature: ``X-TileMatrix-Signature: sha256=<hex>``, the HMAC-SHA256 with
the subscription's secret of ``<timestamp>.<body>``, where the timestamp is
``X-TileMatrix-Timestamp`` (Unix seconds). A receiver recomputes it over
the raw body and refuses a timestamp older than a few minutes (a replay)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import EmailMessage

SIGNATURE_HEADER = "X-TileMatrix-Signature"
TIMESTAMP_HEADER = "X-TileMatrix-Timestamp"
TIMEOUT_S = 10.0


class DeliveryError(Exception):
    """The channel did not take the message; worth another attempt."""


def signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signature_valid(
    secret: str, timestamp: str, body: bytes, sent: str, *, max_age_s: float = 300
) -> bool:
    """What a receiver checks: the signature over the raw body, and a fresh
    timestamp."""
    try:
        age = time.time() - int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(age) > max_age_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), sent or "")


def webhook_body(notification) -> bytes:
    text = notification.text
    if notification.link:
        text = f"{text}\n{notification.link}"
    return json.dumps(
        {
            "text": f"*{notification.subject}*\n{text}",
            "topic": notification.topic,
            "subject": notification.subject,
            "link": notification.link,
            "data": notification.data,
        },
        sort_keys=True,
    ).encode()


def webhook_post(*, url: str, secret: str, notification) -> str:
    """POST the message; the receiver's status line, or DeliveryError."""
    body = webhook_body(notification)
    timestamp = str(int(time.time()))
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "TileMatrix-notifications",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(secret, timestamp, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{url} unreachable: {reason}") from None


def email_send(*, to: str, notification) -> str:
    text = notification.text
    if notification.link:
        text = f"{text}\n\n{notification.link}"
    message = EmailMessage(
        subject=notification.subject,
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
        headers={"X-TileMatrix-Topic": notification.topic},
    )
    try:
        sent = message.send(fail_silently=False)
    except OSError as exc:  # smtplib's errors are OSErrors
        raise DeliveryError(f"mail not taken: {exc}") from None
    if not sent:
        raise DeliveryError("the mail backend sent nothing")
    return f"mail to {to}"
