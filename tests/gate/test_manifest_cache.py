"""GET /api/v1/manifest is built once per change of the approved rows and
answers 304 to a client that holds it: production hosts poll it."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from matrix.gate.services import (
    proposal_approve,
    proposal_open,
    proposal_reevaluate,
    proposal_rollout,
)
from matrix.models import Status

MANIFEST = "/api/v1/manifest"


@pytest.fixture
def approved(world):
    world.green(world.old)
    world.record("softmax", world.cpu, world.new, Status.PASS)
    world.record("gemm", world.cpu, world.new, Status.PASS)
    proposal = proposal_open(
        baseline=world.old,
        candidate=world.new,
        device_types=[world.cpu],
        by=world.owner,
    )
    proposal_approve(proposal=proposal, by=world.reviewers[0], comment="clean")
    proposal_approve(proposal=proposal, by=world.reviewers[1], comment="agreed")
    return proposal


def choices(response) -> set:
    return {(e["operator"], e["choice"]) for e in response.json()["entries"]}


def test_an_unchanged_manifest_answers_304_until_its_rows_change(
    client, world, approved
):
    first = client.get(MANIFEST, {"toolchain": world.new.name})
    assert ("softmax", "tilelang") in choices(first)
    etag = first["ETag"]
    again = client.get(
        MANIFEST, {"toolchain": world.new.name}, headers={"If-None-Match": etag}
    )
    assert again.status_code == 304 and again.content == b""
    # A failing rerun on the candidate withdraws the approval and its rows.
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    proposal_reevaluate(proposal=approved)
    changed = client.get(
        MANIFEST, {"toolchain": world.new.name}, headers={"If-None-Match": etag}
    )
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert changed.json()["entries"] == []


def test_a_result_that_changes_no_approved_row_keeps_the_manifest(
    client, world, approved, django_assert_max_num_queries
):
    etag = client.get(MANIFEST, {"toolchain": world.new.name})["ETag"]
    world.record("gemm", world.h200, world.old, Status.PASS)
    # The toolchain, then the manifest's version: no row is read.
    with django_assert_max_num_queries(2):
        again = client.get(
            MANIFEST, {"toolchain": world.new.name}, headers={"If-None-Match": etag}
        )
    assert again.status_code == 304


def test_after_a_rollout_the_next_default_manifest_is_the_new_toolchains(
    client, world, approved
):
    # The toolchains are read from lists kept a few seconds: warm them.
    before = client.get(MANIFEST).json()
    assert before["toolchain"]["name"] == world.old.name
    proposal_rollout(proposal=approved, by=world.reviewers[2])
    after = client.get(MANIFEST).json()
    assert after["toolchain"]["name"] == world.new.name
    assert ("softmax", "tilelang") in {
        (e["operator"], e["choice"]) for e in after["entries"]
    }


def test_a_toolchain_newer_than_the_kept_lists_is_found(client, world, approved):
    from matrix.models import Toolchain

    client.get(MANIFEST)
    newest = Toolchain.objects.create(name="tilelang-9.9.9", fingerprint="9" * 64)
    response = client.get(MANIFEST, {"toolchain": newest.fingerprint})
    assert response.status_code == 200
    assert response.json()["toolchain"]["name"] == "tilelang-9.9.9"
    missing = client.get(MANIFEST, {"toolchain": "tilelang-0.0.0"})
    assert missing.status_code == 404


def test_a_client_that_accepts_gzip_gets_the_same_manifest_gzipped(
    client, world, approved
):
    params = {"toolchain": world.new.name}
    plain = client.get(MANIFEST, params)
    packed = client.get(MANIFEST, params, headers={"Accept-Encoding": "br, gzip"})
    assert "Content-Encoding" not in plain
    assert packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"] and "Accept-Encoding" in plain["Vary"]
    unpacked = json.loads(gzip.decompress(packed.content))
    assert unpacked["entries"] == plain.json()["entries"]
    # Each representation has its own tag, and each answers 304 to its own.
    assert packed["ETag"] != plain["ETag"]
    again = client.get(
        MANIFEST,
        params,
        headers={"Accept-Encoding": "gzip", "If-None-Match": packed["ETag"]},
    )
    assert again.status_code == 304 and again["ETag"] == packed["ETag"]
    # Refused by quality 0: the plain answer.
    refused = client.get(MANIFEST, params, headers={"Accept-Encoding": "gzip;q=0"})
    assert "Content-Encoding" not in refused and refused.json() == plain.json()
    # The gzipped copy follows the data: a withdrawn approval empties it.
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    proposal_reevaluate(proposal=approved)
    changed = client.get(
        MANIFEST,
        params,
        headers={"Accept-Encoding": "gzip", "If-None-Match": packed["ETag"]},
    )
    assert changed.status_code == 200
    assert json.loads(gzip.decompress(changed.content))["entries"] == []


def test_a_serving_host_reads_only_its_own_device_types_entries(
    client, world, approved
):
    params = {"toolchain": world.new.name}
    whole = client.get(MANIFEST, params).json()["entries"]
    assert {e["device_type"] for e in whole} == {str(world.cpu)}
    cpu = client.get(MANIFEST, {**params, "device_type": str(world.cpu)})
    assert cpu.json()["entries"] == whole
    # A device type the approval did not cover: nothing is approved there.
    h200 = client.get(MANIFEST, {**params, "device_type": str(world.h200)})
    assert h200.status_code == 200 and h200.json()["entries"] == []
    assert h200["ETag"] != cpu["ETag"]
    again = client.get(
        MANIFEST,
        {**params, "device_type": str(world.h200)},
        headers={"If-None-Match": h200["ETag"]},
    )
    assert again.status_code == 304
    # A name no device type has is a 404 that names those there are.
    unknown = client.get(MANIFEST, {**params, "device_type": "NVIDIA H100"})
    assert unknown.status_code == 404
    assert str(world.h200) in unknown.json()["detail"]


def test_while_one_reader_rebuilds_a_changed_manifest_the_others_get_the_one_before(
    client, world, approved, django_assert_max_num_queries
):
    """Single flight: another web worker holds the rebuild's lock (as it
    does while it reads the rows); this reader is given the manifest before
    the change, with that manifest's own ETag, and reads no entry."""
    from django.core.cache import cache

    first = client.get(MANIFEST, {"toolchain": world.new.name})
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    proposal_reevaluate(proposal=approved)
    # The key of the changed manifest, as the view names it.
    from matrix.cache import manifest_version, read_key

    key = read_key("api-manifest", world.new.pk, None, version=manifest_version())
    cache.add(key + ":computing", time.time(), 30)
    with django_assert_max_num_queries(6):
        during = client.get(MANIFEST, {"toolchain": world.new.name})
    assert during["ETag"] == first["ETag"]
    assert choices(during) == choices(first)
    cache.delete(key + ":computing")
    after = client.get(MANIFEST, {"toolchain": world.new.name})
    assert after["ETag"] != first["ETag"] and after.json()["entries"] == []


def test_a_cache_that_lost_the_manifest_answers_from_its_snapshot_not_a_rebuild(
    client, world, approved, monkeypatch
):
    from django.core.cache import cache

    from matrix import api_manifest
    from matrix.models import ManifestSnapshot

    first = client.get(MANIFEST, {"toolchain": world.new.name})
    packed = client.get(
        MANIFEST, {"toolchain": world.new.name}, headers={"Accept-Encoding": "gzip"}
    )
    (snapshot,) = ManifestSnapshot.objects.all()
    assert gzip.decompress(bytes(snapshot.body_gzip)) == first.content

    # The shared cache restarts empty; building the manifest would fail.
    cache.clear()
    monkeypatch.setattr(api_manifest, "manifest_for", fail_if_built)
    again = client.get(MANIFEST, {"toolchain": world.new.name})
    zipped = client.get(
        MANIFEST, {"toolchain": world.new.name}, headers={"Accept-Encoding": "gzip"}
    )

    assert (again.content, again["ETag"]) == (first.content, first["ETag"])
    assert (zipped.content, zipped["ETag"]) == (packed.content, packed["ETag"])
    # Another version is never answered from it: a withdrawn approval
    # builds the new manifest, which replaces the snapshot of that read.
    monkeypatch.undo()
    world.record("softmax", world.cpu, world.new, Status.COMPILE_ERROR)
    proposal_reevaluate(proposal=approved)
    cache.clear()
    changed = client.get(MANIFEST, {"toolchain": world.new.name})
    assert changed.json()["entries"] == []
    (snapshot,) = ManifestSnapshot.objects.all()
    assert gzip.decompress(bytes(snapshot.body_gzip)) == changed.content


def fail_if_built(**_):
    raise AssertionError("the manifest was built again")
