"""Tries, from inside a submitted kernel, what the trust-boundary report did,
and reports each outcome by name (paths in a message are shortened by the
harness): reading the database file and the runner key, connecting to
PostgreSQL's Unix socket and to a canary socket of the host (by path, and
abstract), loopback TCP to the database and the broker, writing to /tmp and
/dev/shm, and seeing the host's processes, SysV shared memory, host name and
environment. The test fills in the paths and names."""

import os
import socket

import tilelang.cpu.language as T


def _outcome(action) -> str:
    try:
        action()
    except OSError as exc:
        return f"{type(exc).__name__}({exc.errno})"
    return "ok"


def _read(path):
    with open(path, "rb") as stream:
        stream.read()


def _unix(address):
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(3)
    try:
        client.connect(address)
    finally:
        client.close()


def _tcp(port):
    socket.create_connection(("127.0.0.1", port), timeout=3).close()


def _write(path):
    with open(path, "w") as stream:
        stream.write("tm-escape")


def _processes() -> str:
    seen = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                seen.append(f"{pid}:{comm.read().strip()}")
        except OSError:
            pass
    return ",".join(seen)


def _shared_memory() -> str:
    with open("/proc/sysvipc/shm") as table:
        return str(len(table.readlines()) - 1)


report = {
    "db": _outcome(lambda: _read("@DB_PATH@")),
    "runner_key": _outcome(lambda: _read("@KEY_PATH@")),
    "postgres_socket": _outcome(lambda: _unix("/var/run/postgresql/.s.PGSQL.5432")),
    "canary_socket": _outcome(lambda: _unix("@SOCKET_PATH@")),
    "canary_abstract": _outcome(lambda: _unix("\0@ABSTRACT_NAME@")),
    "tcp_postgres": _outcome(lambda: _tcp(5432)),
    "tcp_redis": _outcome(lambda: _tcp(6379)),
    "tmp_write": _outcome(lambda: _write("/tmp/@TOKEN@")),
    "shm_write": _outcome(lambda: _write("/dev/shm/@TOKEN@")),
    "processes": _processes(),
    "self": str(os.getpid()),
    "sysv_shm": _shared_memory(),
    "hostname": socket.gethostname(),
    "environment": ",".join(sorted(os.environ)),
}
raise RuntimeError("probe " + "; ".join(f"{k}={v}" for k, v in report.items()))


def program(shape, dtype, target):
    M, N = shape["M"], shape["N"]

    @T.prim_func
    def probe_host(
        A: T.Tensor((M, N), dtype),
        B: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M) as i:
            for j in T.serial(N):
                C[i, j] = A[i, j] + B[i, j]

    return probe_host
