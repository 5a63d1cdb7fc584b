"""What a harness child is started with: the bwrap command line and the
paths bound into it. The escapes themselves are tried through the real
sandbox in tests/security/test_sandbox_escapes.py; here, the command that
every child (library, builder, executor, judge) starts through, including
the GPU binds this host has no GPU to exercise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runners.harness import isolation
from runners.harness.children import REPO_ROOT, child_mounts, protected_paths

SECRETS = (
    "/var/run/postgresql/.s.PGSQL.5432",
    "/run/redis/redis.sock",
    "/root/.ssh/id_ed25519",
    os.path.join(REPO_ROOT, "var", "db.sqlite3"),
    os.path.join(REPO_ROOT, "var", "secret_key"),
    os.path.join(REPO_ROOT, "var", "server_ed25519.key"),
)


def _mounts(tmp_path: Path, **options) -> isolation.Mounts:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    options.setdefault("trusted", False)
    options.setdefault("kinds", {"c"})
    return child_mounts(
        sys.executable, home=str(home), spec=str(tmp_path / "spec.json"), **options
    )


def _bound(mounts: isolation.Mounts) -> list[str]:
    return [
        *mounts.read_only,
        *mounts.writable,
        *(source for source, _ in mounts.aliases),
        *mounts.devices,
    ]


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _contains(argv: list[str], part: list[str]) -> int | None:
    """Where ``part`` starts in ``argv``, or None."""
    for start in range(len(argv) - len(part) + 1):
        if argv[start : start + len(part)] == part:
            return start
    return None


def test_a_child_starts_in_new_namespaces_as_a_uid_without_privileges():
    argv = isolation.bwrap_argv(["python", "-m", "x"], isolation.NO_MOUNTS, uid=61003)
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"):
        assert flag in argv
    assert "--die-with-parent" in argv and "--unshare-user" not in argv
    drop = [
        "setpriv",
        "--reuid=61003",
        "--regid=61003",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        "python",
        "-m",
        "x",
    ]
    assert argv[-len(drop) :] == drop
    # A private /tmp and /dev/shm, any user's to write, before any bind.
    tmp = _contains(argv, ["--perms", "1777", "--size"])
    assert tmp is not None and argv[tmp + 4 : tmp + 6] == ["--tmpfs", "/tmp"]
    assert _contains(argv, ["--tmpfs", "/dev/shm"]) is not None


def test_without_root_a_child_gets_a_user_namespace_and_keeps_the_uid():
    argv = isolation.bwrap_argv(["python"], isolation.NO_MOUNTS, uid=None)
    assert "--unshare-user" in argv and "setpriv" not in argv
    assert argv[-2:] == ["--", "python"]


def test_no_child_sees_var_the_hosts_sockets_or_root(tmp_path):
    for trusted in (False, True):
        for kinds in (set(), {"c"}, {"cuda"}):
            mounts = _mounts(tmp_path, trusted=trusted, kinds=kinds)
            for path in _bound(mounts):
                for secret in SECRETS:
                    assert not _within(secret, path), (path, secret)


def test_a_child_gets_its_toolchain_and_the_harness_but_only_the_judge_the_library(
    tmp_path,
):
    untrusted = _mounts(tmp_path, trusted=False)
    trusted = _mounts(tmp_path, trusted=True)
    library = os.path.join(REPO_ROOT, "runners", "kernels")
    assert library not in untrusted.read_only and library in trusted.read_only
    for mounts in (untrusted, trusted):
        assert sys.base_prefix in mounts.read_only
        assert os.path.join(REPO_ROOT, "runners", "harness") in mounts.read_only
        assert mounts.writable == (str(tmp_path / "home"),)


def test_a_toolchain_path_holding_var_or_a_whole_host_tree_is_never_bound(tmp_path):
    toolchain = tmp_path / "toolchain" / "lib"
    toolchain.mkdir(parents=True)
    paths = [REPO_ROOT, "/", "/root", "/tmp", "/var", str(toolchain)]
    kept = isolation.bindable(paths, protected_paths())
    assert kept == (str(toolchain),)


def test_a_cuda_child_gets_the_gpu_nodes_driver_libraries_and_sys_faked_gpu(
    tmp_path, monkeypatch
):
    # No GPU here: the host's answers about one are faked, the command built
    # from them is the real one.
    nodes = ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    drivers = tmp_path / "nvidia" / "lib64"
    drivers.mkdir(parents=True)
    (drivers / "libcuda.so.550.54.15").write_bytes(b"")
    (drivers / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    listing = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {drivers}/libcuda.so.1\n"
        "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
    )
    monkeypatch.setattr(isolation, "gpu_nodes", lambda kind: nodes)
    monkeypatch.setattr(isolation, "loader_cache", lambda: listing)
    mounts = _mounts(tmp_path, kinds={"cuda"})
    argv = isolation.bwrap_argv(["python"], mounts, uid=61000)
    fresh_dev = argv.index("--dev")
    for node in nodes:
        at = _contains(argv, ["--dev-bind", node, node])
        assert at is not None and at > fresh_dev
    assert _contains(argv, ["--ro-bind", str(drivers), str(drivers)]) is not None
    assert _contains(argv, ["--ro-bind", "/sys", "/sys"]) is not None
    # The builder only calls program(): no GPU, no /sys.
    builder = _mounts(tmp_path, kinds=set())
    assert builder.devices == () and "/sys" not in builder.read_only


def test_without_a_gpu_a_cuda_child_gets_the_toolkit_only(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-12.8"
    (toolkit / "bin").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setattr(isolation, "gpu_nodes", lambda kind: [])
    mounts = _mounts(tmp_path, kinds={"cuda"})
    assert str(toolkit) in mounts.read_only
    assert mounts.devices == () and "/sys" not in mounts.read_only


def test_the_mount_points_above_a_bind_are_open_to_the_childs_uid(tmp_path):
    # bwrap makes missing parents 0700 root: a uid of its own could not pass.
    mounts = _mounts(tmp_path)
    argv = isolation.bwrap_argv(["python"], mounts, uid=61000)
    home_parent = str(tmp_path)
    assert _contains(argv, ["--perms", "0755", "--dir", home_parent]) is not None
    assert _contains(argv, ["--perms", "0755", "--dir", "/tmp"]) is None


def test_a_child_of_its_own_uid_follows_etc_alternatives_links():
    # Hosts where CUDA_HOME=/usr/local/cuda -> /etc/alternatives/cuda: on the
    # H200 the child could not reach nvcc because /etc was 0700 root inside.
    # Needs root and bubblewrap, as the sandbox itself (CI runs as root).
    assert isolation.confinement().level == isolation.FULL, (
        "run as root with bubblewrap installed"
    )
    argv = isolation.bwrap_argv(
        ["/usr/bin/stat", "-L", "-c", "%F", "/etc/alternatives", "/etc/ld.so.cache"],
        isolation.NO_MOUNTS,
        uid=61004,
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "directory"


def test_a_host_compiler_outside_usr_is_reachable_in_the_sandbox(monkeypatch):
    # The H200 image sets CXX to a g++ under /opt, which TileLang hands to
    # nvcc as -ccbin (and runs itself for the C backend): the child could
    # not find it. A real C-target job here, compiled through such a
    # compiler (a wrapper that reads a file of its prefix, as cc1plus
    # lives under libexec); it must reach neither its prefix's other parts.
    import shutil
    import tempfile

    from runners.harness.sandbox import run_job

    assert isolation.confinement().level == isolation.FULL, (
        "run as root with bubblewrap installed"
    )
    prefix = Path(tempfile.mkdtemp(prefix="tm-compiler-"))
    try:
        prefix.chmod(0o755)
        for part in ("bin", "libexec", "secrets"):
            (prefix / part).mkdir(mode=0o755)
        (prefix / "libexec" / "cc1plus-marker").write_text("here\n")
        (prefix / "secrets" / "token").write_text("not for children\n")
        wrapper = prefix / "bin" / "g++"
        wrapper.write_text(
            "#!/bin/sh\n"
            'here="$(dirname "$0")/.."\n'
            'cat "$here/libexec/cc1plus-marker" >/dev/null || exit 3\n'
            'test -e "$here/secrets/token" && exit 4\n'
            'exec /usr/bin/g++ "$@"\n'
        )
        wrapper.chmod(0o755)
        monkeypatch.setenv("CXX", str(wrapper))
        job = {
            "operator": "row_sum",
            "shape": {"M": 7, "N": 33},
            "dtype": "float32",
            "target": {"kind": "c"},
            "stage": "build",
        }
        result = run_job(job, cache_dir=str(prefix / "cache"))
        assert result["status"] == "built", result["error"]
        assert str(prefix / "bin") in _bound(_mounts_for_compiler())
        assert str(prefix / "secrets") not in _bound(_mounts_for_compiler())
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def _mounts_for_compiler() -> isolation.Mounts:
    return child_mounts(
        sys.executable, home="/nonexistent", spec="/x", trusted=True, kinds={"c"}
    )


def test_supervisors_with_different_temp_folders_take_different_uids(tmp_path):
    """Two supervisors of one host, one of them with a TMPDIR (or systemd's
    PrivateTmp) of its own, took the same uid and killed each other's
    children."""
    assert isolation.confinement().level == isolation.FULL, "run as root with bwrap"
    held = isolation.acquire()
    try:
        other_tmp = tmp_path / "private-tmp"
        other_tmp.mkdir()
        taken = subprocess.run(
            [
                sys.executable,
                "-c",
                "from runners.harness import isolation; print(isolation.acquire().uid)",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "TMPDIR": str(other_tmp)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(taken.stdout) != held.uid
    finally:
        held.release()
