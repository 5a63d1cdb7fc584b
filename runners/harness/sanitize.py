"""Make compiler and runtime messages safe to store and group.

A stored message keeps what a reader needs (shapes, dtype, target, TileLang
pass names, the toolchain's own package-relative paths) and loses what would
leak (home, temp and install paths, environment values, tensor contents) or
would differ between two runs of the same error (random temp names).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping

MIN_SECRET_LEN = 6
REDACTED = "<redacted>"

# An absolute path: a "/" that does not continue a word, URL, expression or
# relative path, then path characters.
_ABS_PATH = re.compile(r"(?<![\w.:/\])>~-])/(?:[\w.+@~-]+/)*[\w.+@~-]*")
_PACKAGE_ROOT = re.compile(r"^.*/(?:site|dist)-packages/")
# The toolchain's own source tree as compiled into its binaries (for example
# "/project/src/transform/x.cc"): keep from "src/" or "include/" on.
_TOOLCHAIN_TREE = re.compile(r"^.*?/(?=(?:src|include|python|3rdparty)/)")
# A name Python's tempfile made ("tmp" and 8 random characters) as a path
# component: it differs on every run of the same error.
_TEMP_NAME = re.compile(r"(?<![^/])tmp[a-z0-9_]{8}(?![a-z0-9_])")
TEMP_NAME = "tmpXXXXXXXX"

_TENSOR_REPR = re.compile(r"\b(tensor|array|Tensor)\((?:[^()]|\([^()]*\))*\)", re.S)
_INNER_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_FLOATISH = re.compile(
    r"\d\.\d|\d[eE][-+]?\d|\bnan\b|\binf\b|\.\.\.|<data>", re.IGNORECASE
)

_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_LINE_COL = re.compile(r"(:\d+)+\b")
_LINE_WORD = re.compile(r"\b(line|col|column)\s+\d+", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
_SPACE = re.compile(r"\s+")


def sanitize(
    text: str,
    *,
    roots: Iterable[str] = (),
    private: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    keep_data: bool = False,
) -> str:
    """Return ``text`` without private paths, environment values or tensor data.

    ``roots`` are directories whose paths become relative (the repository);
    ``private`` are directories, besides home and temp, whose files are named
    by their leaf only (a child's sandbox, a kernel cache); ``environ`` is the
    environment whose values are redacted (default: this process's);
    ``keep_data`` leaves number lists alone (generated code).
    """
    environ = os.environ if environ is None else environ
    roots = _longest_first(roots)
    private = _longest_first([*private, *_home_and_temp()])
    if not keep_data:
        text = _TENSOR_REPR.sub(lambda m: f"{m.group(1)}(<data>)", text)
        text = _strip_float_lists(text)
    text = _ABS_PATH.sub(
        lambda m: _TEMP_NAME.sub(TEMP_NAME, _short_path(m.group(0), roots, private)),
        text,
    )
    return _redact_values(text, environ)


def _home_and_temp() -> list[str]:
    """Home and temp directories: a file there is named by its leaf only (the
    directories between are the host's or one run's, such as a temp HOME or
    a random temp name, and would split the signatures of equal errors)."""
    return [tempfile.gettempdir(), "/tmp", "/var/tmp", os.path.expanduser("~")]


def _longest_first(dirs: Iterable[str]) -> list[str]:
    return sorted({d.rstrip("/") for d in dirs if d and d != "/"}, key=len)[::-1]


def _short_path(path: str, roots: list[str], private: list[str]) -> str:
    if path == "/":
        return path
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return path[len(root) + 1 :] or "."
    if _PACKAGE_ROOT.match(path):
        return _PACKAGE_ROOT.sub("", path)
    in_private = any(path.startswith(d + "/") for d in private)
    if not in_private and _TOOLCHAIN_TREE.match(path):
        return _TOOLCHAIN_TREE.sub("", path)
    return "<path>/" + path.rstrip("/").rsplit("/", 1)[-1]


def _strip_float_lists(text: str) -> str:
    """Replace bracketed lists of floats (tensor rows) by ``[<data>]``, inner
    lists first so that nested rows collapse; integer lists (shapes) stay."""
    while True:
        replaced = _INNER_BRACKETS.sub(
            lambda m: "[<data>]" if _FLOATISH.search(m.group(0)) else m.group(0),
            text,
        )
        collapsed = re.sub(r"\[(?:\s*\[<data>\]\s*,?)+\s*\]", "[<data>]", replaced)
        if collapsed == text:
            return text
        text = collapsed


def _redact_values(text: str, environ: Mapping[str, str]) -> str:
    values = sorted(
        {v for v in environ.values() if len(v) >= MIN_SECRET_LEN}, key=len, reverse=True
    )
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def normalize(message: str) -> str:
    """The message with everything that varies between runs of the same error
    (addresses, numbers, line numbers, spacing) replaced by placeholders."""
    text = _HEX.sub("0x#", message)
    text = _LINE_WORD.sub(lambda m: f"{m.group(1)} #", text)
    text = _LINE_COL.sub(":#", text)
    text = _NUMBER.sub("#", text)
    return _SPACE.sub(" ", text).strip()


def error_signature(message: str) -> str:
    """A short stable hash of the normalized message: equal errors group."""
    return hashlib.sha256(normalize(message).encode()).hexdigest()[:16]
