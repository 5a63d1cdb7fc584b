"""What a library revision pins: an operator's module together with every
module of this package it imports, directly or through another one.

``attention_causal`` is a few lines over ``attention``'s kernels, and every
operator leans on ``common``'s tile arithmetic: a revision named by the
operator's own file alone would not change when its kernel did, and old
evidence would pass for the new code. The server (when it mirrors the
library into the catalogue) and a runner (before it runs a library job) both
name a revision by the sha256 of this text. The modules are read, never
imported: a runner checks its copy before any kernel code runs.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
HEADER = "# runners/kernels/"


def library_source(name: str, package: Path = PACKAGE) -> str | None:
    """The operator's module, then the package modules it depends on in name
    order, each under a line naming its file; None for no such operator."""
    if not name.isidentifier() or not (package / f"{name}.py").is_file():
        return None
    found: list[str] = []
    pending = [name]
    while pending:
        stem = pending.pop()
        if stem in found or not (package / f"{stem}.py").is_file():
            continue
        found.append(stem)
        pending.extend(_package_imports((package / f"{stem}.py").read_text()))
    return "".join(
        f"{HEADER}{stem}.py\n{(package / f'{stem}.py').read_text()}"
        for stem in [name, *sorted(found[1:])]
    )


@functools.lru_cache(maxsize=64)
def _package_imports(text: str) -> tuple[str, ...]:
    """The modules of this package a module's text imports. Cached by the
    text itself: parsing was most of a catalogue sync (every operator's
    modules, at every start and in every test that seeds the catalogue),
    and a module whose text changed is parsed again."""
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.append(node.module.split(".")[0])
            else:  # from . import a, b
                names.extend(alias.name for alias in node.names)
    return tuple(names)


def revision_sha256(source: str) -> str:
    """The sha256 that names a revision by its text."""
    return hashlib.sha256(source.encode()).hexdigest()


def library_sha256(name: str, package: Path = PACKAGE) -> str | None:
    """The sha256 naming this copy's revision of a library operator; None
    for no such operator."""
    source = library_source(name, package)
    return None if source is None else revision_sha256(source)


def operator_module(source: str) -> str:
    """The operator's own module out of a library revision's text: what a
    submitted replacement (one module) is shown against. Other text comes
    back as it is."""
    lines = source.splitlines(keepends=True)
    if not lines or not lines[0].startswith(HEADER):
        return source
    own = []
    for line in lines[1:]:
        if line.startswith(HEADER) and line.rstrip().endswith(".py"):
            break
        own.append(line)
    return "".join(own)
