"""The files management commands read and write: a wrong --out is refused
before any work, a write is all or nothing, unreadable JSON is one line."""

from __future__ import annotations

import json
import os
import re
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
    from runners import files as _files

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


def fifo(path):
    os.mkfifo(path)


def link_to_a_file(path):
    target = path.with_name("target.json")
    target.write_text("kept")
    path.symlink_to(target)


def dangling_link(path):
    path.symlink_to(path.with_name("nowhere.json"))


@pytest.mark.parametrize(
    ("make", "kind", "is_kind"),
    [
        (fifo, "named pipe (FIFO)", stat.S_ISFIFO),
        (link_to_a_file, "symbolic link", stat.S_ISLNK),
        (dangling_link, "symbolic link", stat.S_ISLNK),
    ],
)
def test_a_target_that_is_not_a_regular_file_is_refused_and_left_as_it_is(
    catalog, tmp_path, make, kind, is_kind
):
    target = tmp_path / "manifest.json"
    make(target)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CommandError, match=f"is a {re.escape(kind)}, not a regular"):
        # The toolchain is not even looked up: refused before any work.
        call_command("export_manifest", "--toolchain", "nope", "--out", str(target))
    assert is_kind(target.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    linked = tmp_path / "target.json"
    assert not linked.exists() or linked.read_text() == "kept"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_at_the_target_is_refused_and_kept(tmp_path):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(CommandError, match="is a character device, not a regular"):
        OutputFile(str(node))
    assert stat.S_ISCHR(node.lstat().st_mode)


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


def test_export_manifest_refuses_an_empty_toolchain_rather_than_use_the_current(
    catalog,
):
    with pytest.raises(CommandError, match="--toolchain: must not be empty"):
        call_command("export_manifest", "--toolchain", "", stdout=StringIO())


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

    from matrix.fleet import services
    from matrix.models import DeviceType, Shape, Toolchain
    from runners import signing
    from runners.protocol import result_envelope
    from tests.runners.conftest import cpu_inventory

    key = Ed25519PrivateKey.generate()
    services.runner_register(
        token=services.token_create(expires=timedelta(hours=1)),
        name="lab",
        public_key=signing.public_key_hex(key),
        inventory=cpu_inventory(),
    )
    services.runner_approve(name="lab")
    cells = [
        (shape, DeviceType.objects.get(backend="c"), Toolchain.objects.get())
        for shape in Shape.objects.filter(source_profile="cpu-smoke")
    ]
    sweep, _ = services.bundle_plan(runner_name="lab", cells=cells)
    job = sweep.jobs.first()
    signed = result_envelope(
        job={"job": job.pk, "attempt": job.attempt},
        result={"status": "pass"},
        runner_name="lab",
        key=key,
    )
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": [signed]}))
    out = tmp_path / "lab.evidence.json"
    call_command(
        "evidence", "export", "--sweep", str(sweep.pk), "--results", str(results),
        "--out", str(out), stdout=StringIO(),
    )  # fmt: skip
    assert len(json.loads(out.read_text())["jobs"]) == sweep.total > 0
