"""GET /api/v1/manifest: the approved kernel table production code reads."""

from __future__ import annotations

from django.db.models import Q
from ninja import Router
from ninja.errors import HttpError

from matrix import queries
from matrix.api_errors import Problem
from matrix.cache import json_answer, manifest_version, read_key
from matrix.gate.manifest import manifest_for, snapshot_keep, snapshot_read
from matrix.models import DeviceType, Toolchain

router = Router(tags=["manifest"])


def toolchain_lookup(ref: str | None) -> Toolchain:
    """A toolchain by name or fingerprint; the current one when ``ref`` is empty."""
    if not ref:
        toolchain = Toolchain.objects.filter(is_current=True).first()
        if toolchain is None:
            raise LookupError("no toolchain is current; name one with ?toolchain=")
        return toolchain
    toolchain = Toolchain.objects.filter(Q(name=ref) | Q(fingerprint=ref)).first()
    if toolchain is None:
        raise LookupError(f"no toolchain named or fingerprinted {ref!r}")
    return toolchain


@router.get(
    "/manifest", response={200: dict, 304: None, 404: Problem}, url_name="manifest"
)
def manifest(request, toolchain: str | None = None, device_type: str | None = None):
    """The approved (operator, dtype, device type, shape rule) → tilelang or
    reference table for a toolchain (name or fingerprint; default: current).
    `device_type` (its name as the entries write it, e.g. `NVIDIA H200 ·
    sm_90a · cuda`) keeps only that device type's entries: what a serving
    host reads. Built once per change of the approved rows for every
    reader; send the `ETag` back in `If-None-Match` and an unchanged
    manifest answers 304 with no body."""
    version = manifest_version()
    # From the lists kept a few seconds, checked against the current
    # toolchain the version read: the ORM lookup cost a third of a kept
    # answer.
    current = version[-1]
    chosen = queries.find_toolchain(
        queries.toolchains_as_of(current), toolchain or current or ""
    )
    if chosen is None:
        raise HttpError(
            404,
            f"no toolchain named or fingerprinted {toolchain!r}"
            if toolchain
            else "no toolchain is current; name one with ?toolchain=",
        )
    device = None
    if device_type is not None:
        device = device_named(device_type)
        if device is None:
            known = sorted(str(d) for d in queries.catalogue_lists()[1].values())
            raise HttpError(
                404,
                f"no device type named {device_type!r}; known: {', '.join(known)}",
            )
    # The version apart: while one reader rebuilds the manifest after an
    # approval, the others are given the one before (matrix.cache), not
    # each a rebuild of their own.
    key = read_key("api-manifest", chosen.pk, device and device.pk, version=version)
    # Kept in the database too: a cache restarted or evicted does not make
    # every serving host's next read a rebuild.
    return json_answer(
        request,
        key,
        lambda: manifest_for(toolchain=chosen, device_type=device),
        None,
        snapshots=(snapshot_read, snapshot_keep),
    )


def device_named(label: str) -> DeviceType | None:
    """The device type whose name (its str, the manifest's ``device_type``)
    is ``label``, from the kept lists, or from what is there now: a device
    type registered since the lists were read is found."""
    for fresh in (False, True):
        devices = queries.catalogue_lists(fresh=fresh)[1].values()
        found = next((d for d in devices if str(d) == label), None)
        if found is not None:
            return found
    return None
