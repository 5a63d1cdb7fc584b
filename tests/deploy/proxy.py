"""The documented web deployment in subprocesses: gunicorn as docs/deploy.md
runs it, behind nginx with deploy/nginx/tilematrix.conf as shipped. Only
what a test must change is changed (the ports, the static folder, and the
paths an nginx run by a test keeps to a folder of its own); each change
must find what it replaces, so a reshaped config fails here rather than
being tested in a form nobody deploys."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "deploy" / "nginx" / "tilematrix.conf"
DEPLOY_DOC = REPO / "docs" / "deploy.md"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )


def gunicorn_argv(port: int) -> list[str]:
    """docs/deploy.md's gunicorn command, bound to ``port`` on loopback."""
    text = DEPLOY_DOC.read_text()
    found = re.search(r"^(gunicorn matrix\.wsgi[^#\n]*)", text, re.MULTILINE)
    assert found, "docs/deploy.md has no `gunicorn matrix.wsgi` command"
    argv = shlex.split(found.group(1))
    binds = [i for i, a in enumerate(argv) if a in ("-b", "--bind")]
    assert binds, "docs/deploy.md's gunicorn command binds no address"
    for i in reversed(binds):
        del argv[i : i + 2]
    argv[0] = str(Path(sys.executable).parent / "gunicorn")
    return [*argv, "--bind", f"127.0.0.1:{port}"]


def _replace_once(text: str, pattern: str, replacement: str) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{NGINX_CONF.name}: expected one match of {pattern!r}"
    return new


def site_config(*, listen_port: int, upstream_port: int, static: Path) -> str:
    text = NGINX_CONF.read_text()
    text = _replace_once(
        text, r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{listen_port};"
    )
    text = _replace_once(
        text,
        r"^(\s*)server 127\.0\.0\.1:8000;",
        rf"\1server 127.0.0.1:{upstream_port};",
    )
    return _replace_once(text, r"^(\s*)alias \S+;", rf"\1alias {static}/;")


MAIN_CONFIG = """\
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    default_type application/octet-stream;
    access_log {root}/access.log;
    client_body_temp_path {root}/client-body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/tilematrix.conf;
}}
"""


class Nginx:
    """nginx in the foreground, its pid file, logs and temp files in a
    folder of its own (no root needed; run as root, its workers drop to
    nobody, so the folder is left traversable)."""

    def __init__(self, *, listen_port: int, upstream_port: int, static: Path):
        binary = nginx_binary()
        assert binary, "nginx is not installed (apt-get install nginx)"
        self.root = Path(tempfile.mkdtemp(prefix="tm-nginx-"))
        self.root.chmod(0o711)
        (self.root / "tilematrix.conf").write_text(
            site_config(
                listen_port=listen_port, upstream_port=upstream_port, static=static
            )
        )
        main = self.root / "nginx.conf"
        main.write_text(MAIN_CONFIG.format(root=self.root))
        argv = [binary, "-p", str(self.root), "-e", str(self.root / "error.log")]
        checked = subprocess.run(
            [*argv, "-t", "-c", str(main)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stderr
        self.log = (self.root / "stderr.log").open("ab")
        self.process = subprocess.Popen(
            [*argv, "-c", str(main)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{listen_port}"

    def error_log(self) -> str:
        path = self.root / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # nginx's fast shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def wait_answering(url: str, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(url):
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} did not answer {url} within {timeout:.0f} s")
