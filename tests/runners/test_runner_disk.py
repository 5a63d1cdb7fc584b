"""A runner host short of disk, on a real small filesystem (a tmpfs of a few
MB, filled by a file the test deletes to give the space back): a real
TileLang build that cannot write its output ends infra_error, never a
kernel's compile_error, and passes once there is room; a runner short of
disk takes no job, after its kernel cache has given back what it can; a
result the outbox cannot hold is kept once there is room."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from runners import disk, host
from runners.harness import warm

from ..harness.helpers import library_job
from .small_disk import fill, free_bytes, small_disk
from .test_kernel_cache import HOUR, MB, kernel

# A kernel build for the c target writes some tens of KB: left this much,
# the harness child starts, and its build cannot write its library.
BUILD_CANNOT_WRITE = 8192


@pytest.fixture
def short_disk():
    """A 4 MB tmpfs, left BUILD_CANNOT_WRITE free; not under pytest's
    owner-only base, as the harness child runs under a uid of its own."""
    root = Path(tempfile.mkdtemp(prefix="tm-small-disk-"))
    root.chmod(0o711)
    with small_disk(root / "disk", 4) as path:
        yield path
    root.rmdir() if not any(root.iterdir()) else None


@pytest.fixture
def harness_temp_on(monkeypatch):
    """Harness children write where the runner's tempfile module says (its
    sandbox, HOME and TMPDIR): on the given folder."""

    def place(path: Path) -> None:
        monkeypatch.setattr(tempfile, "tempdir", str(path))

    yield place
    warm.end_all()  # no child kept warm with its HOME on a gone disk


@pytest.fixture
def cache_dir():
    path = Path(tempfile.mkdtemp(prefix="tm-disk-cache-"))
    path.chmod(0o711)
    yield path


def job_on_a_full_disk() -> dict:
    return {
        **library_job("elementwise_add", {"M": 5, "N": 9}),
        "stage": "validate",
        "job": 1,
        "attempt": 1,
    }


def test_a_real_build_that_finds_the_disk_full_is_the_runners_trouble(
    short_disk, harness_temp_on, cache_dir, monkeypatch
):
    harness_temp_on(short_disk)
    fill(short_disk, leave_bytes=BUILD_CANNOT_WRITE)
    monkeypatch.setattr(host, "INFRA_RETRIES", 1)
    (result,) = host.jobs_run(
        jobs=[job_on_a_full_disk()],
        interpreter=host.sys.executable,
        cache_dir=cache_dir,
        timeout_s=120,
        disk_short=lambda: disk.disk_short([short_disk], MB),
    )
    assert result["status"] == "infra_error", result
    message = result["error"]["message"]
    assert message.startswith(disk.SHORT_OF_DISK), message
    # What the harness had made of it: a verdict on the kernel.
    assert "the job ended compile_error" in message


@pytest.mark.parametrize(
    "left",
    [0, BUILD_CANNOT_WRITE],
    ids=["the-sandbox-cannot-be-written", "the-build-cannot-write"],
)
def test_once_room_is_made_the_job_is_run_again_and_passes(
    short_disk, harness_temp_on, cache_dir, monkeypatch, left
):
    harness_temp_on(short_disk)
    filler = fill(short_disk, leave_bytes=left)
    monkeypatch.setattr(host, "INFRA_BACKOFF_S", 0.1)
    made_room = []

    def make_room() -> None:
        made_room.append(free_bytes(short_disk))
        filler.unlink()

    answered = []
    (result,) = host.jobs_run(
        jobs=[job_on_a_full_disk()],
        interpreter=host.sys.executable,
        cache_dir=cache_dir,
        timeout_s=120,
        on_result=lambda i, r: answered.append(r["status"]),
        make_room=make_room,
        disk_short=lambda: disk.disk_short([short_disk], MB),
    )
    assert result["status"] == "pass", result["error"]
    assert answered == ["pass"]  # the failed first run was never an answer
    assert len(made_room) == 1 and made_room[0] < MB


def host_on(path: Path) -> host.HostConfig:
    return host.HostConfig(
        directory=path,
        name="cpu-disk",
        server="http://127.0.0.1:1",
        server_public_key="",
        queues=[],
        toolchains={},
    )


def test_a_runner_short_of_disk_first_gives_back_its_kernel_cache(
    short_disk, monkeypatch
):
    monkeypatch.setenv("TILEMATRIX_RUNNER_DISK_FREE_MB", "1")
    config = host_on(short_disk)
    root = host.kernel_cache_root(config)
    for key, ago in (("a", 3 * HOUR), ("b", 2 * HOUR), ("c", HOUR)):
        kernel(root, key, megabytes=1, used_ago=ago, now=time.time())
    fill(short_disk, leave_bytes=64 * 1024)
    assert host.disk_short_now(config).startswith(disk.SHORT_OF_DISK)
    # Halved, least recently used first: room enough to take jobs again.
    assert host.disk_check(config) is None
    assert {p.name for p in root.rglob("kernels/*")} == {"c"}


def test_a_runner_short_of_disk_with_nothing_to_give_back_takes_no_job(
    short_disk, monkeypatch
):
    monkeypatch.setenv("TILEMATRIX_RUNNER_DISK_FREE_MB", "1")
    config = host_on(short_disk)
    filler = fill(short_disk)
    reason = host.disk_check(config)
    assert reason.startswith(disk.SHORT_OF_DISK) and str(short_disk) in reason
    envelope = {"signer": "server"}  # never read: the disk is checked first
    monkeypatch.setattr(host, "jobs_verify", lambda **_: [{"toolchain": "t"}])
    monkeypatch.setattr(host, "python_for", lambda config, fp: "python")
    claimed = []
    monkeypatch.setattr(host, "jobs_claim", lambda **kw: claimed.append(kw) or [])
    with pytest.raises(host.RunnerShortOfDisk, match="free on"):
        host.jobs_execute(envelope=envelope, config=config, timeout_s=1)
    assert claimed == []
    filler.unlink()
    assert host.disk_check(config) is None


def test_a_result_the_outbox_could_not_hold_is_kept_once_there_is_room(short_disk):
    outbox = short_disk / "outbox"
    outbox.mkdir()
    filler = fill(short_disk)
    job = {"job": 7, "attempt": 1}
    envelope = {"payload": {"job": 7}, "signature": "x" * 4096}
    with pytest.raises(OSError) as full:
        host.outbox_keep(outbox, job, envelope)
    assert disk.is_disk_full(full.value)
    tries = []

    def make_room() -> None:
        tries.append(1)
        if len(tries) == 2:  # the operator frees the disk meanwhile
            filler.unlink()

    left = host.outbox_catch_up(
        outbox, [(job, envelope)], make_room=make_room, wait_s=10, every_s=0.05
    )
    assert left == 0 and len(tries) == 2
    assert json.loads((outbox / "7-1.json").read_text()) == envelope


def test_a_result_the_outbox_never_has_room_for_is_given_up_after_a_while(
    short_disk, caplog
):
    outbox = short_disk / "outbox"
    outbox.mkdir()
    fill(short_disk)
    left = host.outbox_catch_up(
        outbox,
        [({"job": 7, "attempt": 1}, {"signature": "x" * 8192})],
        make_room=lambda: None,
        wait_s=0.2,
        every_s=0.05,
    )
    assert left == 1
    assert "sent but not kept in the outbox" in caplog.text
