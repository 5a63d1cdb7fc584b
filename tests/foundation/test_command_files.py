"""The files management commands read and write: a wrong --out is refused
before any work, a write is all or nothing, unreadable JSON is one line."""

from __future__ import annotations

import json
import os
import stat
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from matrix.management.commands._files import OutputFile, read_json


def test_an_output_file_is_written_whole_with_the_usual_mode(tmp_path):
    out = tmp_path / "manifest.json"
    out.write_text("old")
    OutputFile(str(out)).write("new\n")
    assert out.read_text() == "new\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path, monkeypatch
):
    from matrix.management.commands import _files

    out = tmp_path / "results.json"
    out.write_text("old")
    output = OutputFile(str(out))

    def disk_full(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "replace", disk_full)
    with pytest.raises(CommandError, match="cannot write .*: No space left"):
        output.write("new")
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/nonexistent/b.json", "--out /nonexistent/b.json: there is no directory"),
        (".", "--out . is a directory; name a file"),
        ("/proc/b.json", "--out /proc/b.json: cannot write in /proc"),
    ],
)
def test_an_output_file_that_cannot_be_written_is_refused_at_once(path, message):
    with pytest.raises(CommandError, match=message):
        OutputFile(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read .*: No such file"),
        ("{", "is not JSON: Expecting"),
        (b"\xff", "is not JSON: 'utf-8' codec"),
        ("[" * 100_000 + "]" * 100_000, "nests its JSON too deeply to read"),
    ],
)
def test_unreadable_json_is_one_line(tmp_path, text, message):
    path = tmp_path / "in.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(CommandError, match=message):
        read_json(str(path))


def test_export_manifest_refuses_a_wrong_out_before_reading_anything(catalog):
    with pytest.raises(CommandError, match="there is no directory /nonexistent"):
        call_command(
            "export_manifest", "--toolchain", "nope", "--out", "/nonexistent/m.json"
        )


def test_export_manifest_without_a_current_toolchain_names_its_option(catalog):
    with pytest.raises(CommandError, match="name one with --toolchain$"):
        call_command("export_manifest")


def test_evidence_export_refuses_a_wrong_out_before_reading_anything(catalog):
    with pytest.raises(CommandError, match="there is no directory /nonexistent"):
        call_command(
            "evidence", "export", "--sweep", "1", "--results", "missing.json",
            "--out", "/nonexistent/e.json",
        )  # fmt: skip


def test_evidence_export_writes_the_file_it_names(catalog, tmp_path):
    from datetime import timedelta

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from matrix.models import DeviceType, Shape, Toolchain
    from runners import services, signing
    from tests.runners.conftest import cpu_inventory

    services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="lab",
        public_key=signing.public_key_hex(Ed25519PrivateKey.generate()),
        inventory=cpu_inventory(),
    )
    cells = [
        (shape, DeviceType.objects.get(backend="c"), Toolchain.objects.get())
        for shape in Shape.objects.filter(source_profile="cpu-smoke")
    ]
    sweep, _ = services.bundle_plan(runner_name="lab", cells=cells)
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": []}))
    out = tmp_path / "lab.evidence.json"
    call_command(
        "evidence", "export", "--sweep", str(sweep.pk), "--results", str(results),
        "--out", str(out), stdout=StringIO(),
    )  # fmt: skip
    assert len(json.loads(out.read_text())["jobs"]) == sweep.total > 0
