"""The runner's kernel cache stays within TILEMATRIX_RUNNER_KERNEL_CACHE_MB,
least recently used kernels going first; kernels in use, builds under way
and the files beside the entries stay. The last test runs real TileLang
through the sandboxed harness: its cache has the layout evicted here, and a
kernel the harness uses again is stamped as used."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from runners import config, kernel_cache
from runners.kernel_cache import cache_trim, entries

NOW = 1_900_000_000.0
HOUR = 3600.0
MB = 2**20


def kernel(
    root: Path, key: str, *, megabytes: float, used_ago: float, now: float = NOW
) -> Path:
    """A compiled kernel where TileLang 0.1.13 and 0.1.15 keep one."""
    entry = root / "tc0" / "0.1.15" / "linux-x86_64" / "kernels" / key
    entry.mkdir(parents=True)
    library = entry / "kernel_lib.so"
    library.write_bytes(os.urandom(int(megabytes * MB)))
    (entry / "params.json").write_text("{}")
    for path in (library, entry / "params.json", entry):
        os.utime(path, (now - used_ago, now - used_ago))
    return entry


def kept(root: Path) -> set[str]:
    return {e.path.name for e in entries(root, now=NOW)}


def test_the_least_recently_used_kernels_go_first_until_within_the_limit(tmp_path):
    for key, ago in (("old", 48 * HOUR), ("older", 72 * HOUR), ("new", HOUR)):
        kernel(tmp_path, key, megabytes=1, used_ago=ago)
    trimmed = cache_trim(tmp_path, 2 * MB + 64 * 1024, now=NOW)
    assert kept(tmp_path) == {"old", "new"}
    assert trimmed.removed == 1
    assert trimmed.after <= 2 * MB + 64 * 1024
    cache_trim(tmp_path, MB + 64 * 1024, now=NOW)
    assert kept(tmp_path) == {"new"}


def test_a_kernel_in_use_stays_even_over_the_limit(tmp_path):
    kernel(tmp_path, "loading", megabytes=1, used_ago=5)
    kernel(tmp_path, "idle", megabytes=1, used_ago=HOUR)
    trimmed = cache_trim(tmp_path, 0, now=NOW)
    assert kept(tmp_path) == {"loading"}
    assert trimmed.after > 0


def test_builds_left_behind_go_after_an_hour_not_while_they_may_be_written(tmp_path):
    namespace = tmp_path / "tc0" / "0.1.15" / "linux-x86_64"
    for name, ago in (("crashed", 2 * HOUR), ("writing", 60)):
        staging = namespace / ".staging" / name
        staging.mkdir(parents=True)
        (staging / "kernel_lib.so").write_bytes(b"\0" * 8192)
        os.utime(staging / "kernel_lib.so", (NOW - ago, NOW - ago))
        os.utime(staging, (NOW - ago, NOW - ago))
    # TileLang 0.1.13 writes its temporary files straight into tmp/.
    temporary = tmp_path / "tc0" / "tmp" / "123_abc.so"
    temporary.parent.mkdir(parents=True)
    temporary.write_bytes(b"\0" * 8192)
    os.utime(temporary, (NOW - 3 * HOUR, NOW - 3 * HOUR))
    cache_trim(tmp_path, 0, now=NOW)
    assert kept(tmp_path) == {"writing"}


def test_the_device_lock_and_the_compiler_probe_are_never_removed(tmp_path):
    kernel(tmp_path, "k", megabytes=1, used_ago=HOUR)
    beside = [tmp_path / "tc0" / "tilematrix-device.lock", tmp_path / "tc0" / "probe"]
    for path in beside:
        path.write_text("x")
        os.utime(path, (NOW - 99 * HOUR, NOW - 99 * HOUR))
    cache_trim(tmp_path, 0, now=NOW)
    assert kept(tmp_path) == set()
    assert all(path.exists() for path in beside)


def test_the_limit_is_read_in_megabytes_and_a_bad_one_named(monkeypatch):
    monkeypatch.setenv("TILEMATRIX_RUNNER_KERNEL_CACHE_MB", "512")
    assert config.kernel_cache_limit_bytes() == 512 * MB
    monkeypatch.delenv("TILEMATRIX_RUNNER_KERNEL_CACHE_MB")
    assert config.kernel_cache_limit_bytes() == config.KERNEL_CACHE_MB_DEFAULT * MB
    for bad in ("10G", "-1", "1.5"):
        monkeypatch.setenv("TILEMATRIX_RUNNER_KERNEL_CACHE_MB", bad)
        with pytest.raises(
            config.SettingError, match="TILEMATRIX_RUNNER_KERNEL_CACHE_MB"
        ):
            config.kernel_cache_limit_bytes()


@pytest.fixture
def host_folder():
    """Not under pytest's owner-only base: the harness child runs under a
    uid of its own and must reach the kernel cache, as on a runner."""
    path = Path(tempfile.mkdtemp(prefix="tm-kernel-cache-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_real_tilelang_cache_is_found_stamped_when_used_and_evicted(host_folder):
    """Through the sandboxed harness, real TileLang: the kernel it builds
    is one entry here; used again from the cache, it is stamped as used
    now; over the limit and idle, it goes."""
    from runners.harness.sandbox import run_batch

    from ..harness.helpers import library_job

    cache = host_folder / "kernel-cache" / "tc0"
    cache.mkdir(parents=True, mode=0o711)
    cache.parent.chmod(0o711)
    job = library_job("elementwise_add", {"M": 5, "N": 9})
    (first,) = run_batch([job], cache_dir=str(cache), keep_warm=False)
    assert first["status"] == "pass", first["error"]
    (built,) = entries(cache.parent)
    assert built.path.parent.name == "kernels"
    long_ago = time.time() - 48 * HOUR
    for path in (built.path, *built.path.iterdir()):
        os.utime(path, (long_ago, long_ago))
    (again,) = run_batch([job], cache_dir=str(cache), keep_warm=False)
    assert again["status"] == "pass", again["error"]
    (used,) = entries(cache.parent)
    assert used.path == built.path
    assert used.used > time.time() - 600
    # Stamped by the harness: reading a cached kernel changes no mtime.
    assert used.path.stat().st_mtime > time.time() - 600
    later = time.time() + 2 * kernel_cache.IN_USE_S
    assert cache_trim(cache.parent, 0, now=later).removed == 1
    assert entries(cache.parent) == []
