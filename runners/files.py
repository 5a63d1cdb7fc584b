"""The files commands read and write, with bad paths and bad JSON as
one-line errors (``FileProblem``): the runner agent's commands and the
server's management commands (``matrix/management/commands/_files.py``,
which makes them command errors) read and write files alike."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path


class FileProblem(Exception):
    """A file a command cannot read or write; the message says why."""


def read_json(path: str):
    """The JSON document in a file, or a FileProblem saying why not."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise FileProblem(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # malformed JSON or text that is not UTF-8
        raise FileProblem(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise FileProblem(f"{path} nests its JSON too deeply to read") from None


SPECIAL_KINDS = (
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def special_kind(path: Path) -> str | None:
    """What an existing non-regular file at ``path`` is (a directory is
    told apart by its caller), or None for a regular file or none."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    return next((kind for is_kind, kind in SPECIAL_KINDS if is_kind(mode)), None)


class OutputFile:
    """The file a command will write. Checked when made, before the command
    does any work, so a wrong --out (a directory, a missing folder, a pipe,
    a device or a link) costs nothing. Written whole: a
    temporary file beside it is renamed over it, so a failed write leaves
    the old file (or none), never half of the new one."""

    def __init__(self, path: str):
        self.path = Path(path)
        where = f"--out {path}"
        kind = special_kind(self.path)
        if kind:
            # The rename would put a regular file in its place: the pipe or
            # device would be gone, and a link replaced, not its target written.
            raise FileProblem(
                f"{where} is a {kind}, not a regular file; name a file to write"
            )
        if self.path.is_dir():
            raise FileProblem(f"{where} is a directory; name a file")
        if not self.path.parent.is_dir():
            raise FileProblem(f"{where}: there is no directory {self.path.parent}")
        try:
            self._temporary().unlink()
        except OSError as exc:
            raise FileProblem(
                f"{where}: cannot write in {self.path.parent}: {exc.strerror}"
            ) from None

    def _temporary(self) -> Path:
        """A new empty file beside the target, created with the mode a plain
        open() would give it."""
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        return temporary

    def write(self, text: str) -> None:
        temporary = None
        try:
            temporary = self._temporary()
            with temporary.open("w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            if temporary is not None:
                temporary.unlink(missing_ok=True)
            raise FileProblem(f"cannot write {self.path}: {exc.strerror}") from None
