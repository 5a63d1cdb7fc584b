"""Login throttling that hurts only the attacker.

Failed logins are counted per (client address, username) by django-axes, so
five wrong passwords from one place lock that account out from that place
only: the real user elsewhere still signs in. That needs the real client
address. Behind a TLS proxy every connection comes from the proxy, so the
address is read from ``X-Forwarded-For``, but only when the connection
comes from a proxy named in ``TILEMATRIX_TRUSTED_PROXIES``: anyone else
could write any address there, and lock out, or escape the count of, any
address they like.

The header is read from its right end, where the trusted proxies appended
what they saw: each address that is itself a trusted proxy is skipped, and
the first one that is not is the client. What a client wrote further left
is never believed.
"""

from __future__ import annotations

import ipaddress
import math
from datetime import timedelta

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Max
from django.shortcuts import render
from django.utils import timezone


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address) -> bool:
    return address is not None and any(
        address in network for network in settings.TILEMATRIX_TRUSTED_PROXIES
    )


def client_address(request) -> str:
    """The address failed logins are counted against (AXES_CLIENT_IP_CALLABLE)."""
    peer = request.META.get("REMOTE_ADDR", "")
    if not _trusted(_address(peer)):
        return peer
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for hop in reversed(forwarded.split(",")):
        address = _address(hop)
        if address is None:
            # A trusted proxy wrote something that is no address: nothing to
            # its left can be believed, so the proxy's own address counts.
            return peer
        if not _trusted(address):
            return str(address)
    return peer


def locked_until(username: str, address: str):
    """When the (address, username) pair may try again: the cool-off after
    its latest counted failure."""
    cool_off = get_cool_off() or timedelta(0)
    latest = AccessAttempt.objects.filter(
        username=username, ip_address=address
    ).aggregate(latest=Max("attempt_time"))["latest"]
    return (latest or timezone.now()) + cool_off


def lockout_response(request, original_response=None, credentials=None):
    """The page a locked-out login gets (AXES_LOCKOUT_CALLABLE): 429, saying
    when to try again, with Retry-After."""
    username = get_client_username(request, credentials) or ""
    address = getattr(request, "axes_ip_address", None) or client_address(request)
    until = locked_until(username, address)
    seconds = max(1, math.ceil((until - timezone.now()).total_seconds()))
    response = render(
        request,
        "registration/locked_out.html",
        {
            "username": username,
            "until": until,
            "minutes": math.ceil(seconds / 60),
            "failures": settings.AXES_FAILURE_LIMIT,
        },
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response
