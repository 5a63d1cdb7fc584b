"""A static pre-check of submitted kernel sources (stdlib ``ast`` only).

A TileLang kernel needs ``tilelang`` and a little arithmetic; anything that
reaches the process, the files, the network, the clock, the environment or
the harness is refused with the rule that caught it. This is defence in
depth: the sandbox is the boundary, and a source that passes here still runs
only there (a Python check cannot see every dynamic trick).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Modules a kernel source may import (and their submodules).
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "tilelang",
        "math",
        "functools",
        "itertools",
        "operator",
        "dataclasses",
        "typing",
        "enum",
    }
)

# Why the usual suspects are refused; any other module outside the allow-list
# is refused with the generic reason.
MODULE_REASONS = {
    "os": "os reaches processes, files and the environment",
    "posix": "posix reaches processes, files and the environment",
    "sys": "sys reaches the interpreter, its modules and the reporting channel",
    "subprocess": "subprocess starts other programs",
    "socket": "socket opens network connections",
    "ssl": "ssl opens network connections",
    "http": "http opens network connections",
    "urllib": "urllib opens network connections",
    "requests": "requests opens network connections",
    "ctypes": "ctypes calls native code outside the kernel",
    "cffi": "cffi calls native code outside the kernel",
    "importlib": "importlib loads arbitrary modules",
    "builtins": "builtins reaches open/exec/__import__",
    "shutil": "shutil reads and writes files",
    "pathlib": "pathlib reads and writes files",
    "io": "io reads and writes files",
    "tempfile": "tempfile writes files",
    "glob": "glob lists files",
    "multiprocessing": "multiprocessing starts processes",
    "threading": "threading starts threads that outlive the kernel call",
    "concurrent": "concurrent starts processes and threads",
    "signal": "signal changes how the harness stops the child",
    "resource": "resource changes the sandbox's limits",
    "pickle": "pickle runs code while loading data",
    "marshal": "marshal loads code objects",
    "shelve": "shelve unpickles files",
    "code": "code runs arbitrary source",
    "codeop": "codeop compiles arbitrary source",
    "inspect": "inspect reaches frames and the harness's own objects",
    "gc": "gc reaches every object of the harness",
    "time": "time reads or patches the clock the harness times with",
    "timeit": "timeit reads the clock the harness times with",
    "datetime": "datetime reads the clock",
    "runners": "runners is the harness and the operator library, with the reference",
    "matrix": "matrix is the web application",
    "django": "django is the web application",
    "torch": "torch computes the reference; a submitted kernel is TileLang only",
    "numpy": "numpy computes outside the kernel; a submitted kernel is TileLang only",
    "tvm": "tvm internals are reached through tilelang only",
}
GENERIC_MODULE_REASON = "only tilelang and pure-arithmetic modules may be imported"

CALL_REASONS = {
    "open": "open reads and writes files",
    "eval": "eval runs arbitrary source",
    "exec": "exec runs arbitrary source",
    "compile": "compile builds code objects from arbitrary source",
    "__import__": "__import__ loads arbitrary modules",
    "globals": "globals reaches the module's namespace and its builtins",
    "locals": "locals reaches frames",
    "vars": "vars reaches namespaces and their builtins",
    "breakpoint": "breakpoint starts a debugger",
    "input": "input reads the harness's stdin",
    "exit": "exit stops the harness child",
    "quit": "quit stops the harness child",
    "memoryview": "memoryview reads raw memory",
}
ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}
ENVIRONMENT_NAMES = {"environ", "getenv", "putenv", "environb", "unsetenv"}


@dataclass(frozen=True)
class Refusal:
    line: int
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}: {self.reason}"


def precheck(source: str) -> list[Refusal]:
    """Every rule the source breaks, in source order; empty when it passes."""
    try:
        tree = ast.parse(source, filename="submitted_kernel.py")
    except SyntaxError as exc:
        return [Refusal(exc.lineno or 0, "syntax", f"not valid Python: {exc.msg}")]
    refusals: list[Refusal] = []
    for node in ast.walk(tree):
        refusals += _check(node)
    if not any(
        isinstance(n, ast.FunctionDef) and n.name == "program" for n in tree.body
    ):
        refusals.append(
            Refusal(
                1, "program", "the source must define program(shape, dtype, target)"
            )
        )
    return sorted(refusals, key=lambda r: (r.line, r.rule))


def _check(node: ast.AST) -> list[Refusal]:
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Import):
        return [r for alias in node.names if (r := _module(alias.name, line))]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return [
                Refusal(line, "import", "relative imports reach the harness package")
            ]
        refusal = _module(node.module or "", line)
        return [refusal] if refusal else []
    if isinstance(node, ast.Attribute):
        return _attribute(node.attr, line)
    if isinstance(node, ast.Name):
        return _name(node.id, line)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in ATTRIBUTE_FUNCTIONS and not _literal_plain_name(node):
            return [
                Refusal(
                    line,
                    node.func.id,
                    f"{node.func.id} with a computed or dunder name hides attribute access",
                )
            ]
    return []


def _module(name: str, line: int) -> Refusal | None:
    top = name.split(".")[0]
    if top in ALLOWED_MODULES and not any(
        part in MODULE_REASONS for part in name.split(".")[1:]
    ):
        return None
    reason = MODULE_REASONS.get(top)
    if reason is None:
        inner = next((p for p in name.split(".")[1:] if p in MODULE_REASONS), None)
        reason = MODULE_REASONS[inner] if inner else GENERIC_MODULE_REASON
    return Refusal(line, f"import {name}", reason)


def _attribute(attr: str, line: int) -> list[Refusal]:
    if attr.startswith("__") and attr.endswith("__"):
        return [
            Refusal(
                line,
                f".{attr}",
                "dunder attributes reach interpreter internals "
                "(__builtins__, __subclasses__, __globals__, ...)",
            )
        ]
    if attr in ENVIRONMENT_NAMES:
        return [Refusal(line, f".{attr}", "the environment is not the kernel's")]
    if attr in MODULE_REASONS:
        return [
            Refusal(
                line,
                f".{attr}",
                f"reaches {attr} through another module: " + MODULE_REASONS[attr],
            )
        ]
    return []


def _name(name: str, line: int) -> list[Refusal]:
    if name in CALL_REASONS:
        return [Refusal(line, name, CALL_REASONS[name])]
    if name.startswith("__") and name.endswith("__") and name not in ("__name__",):
        return [Refusal(line, name, "dunder names reach interpreter internals")]
    if name in ENVIRONMENT_NAMES:
        return [Refusal(line, name, "the environment is not the kernel's")]
    return []


def _literal_plain_name(call: ast.Call) -> bool:
    if len(call.args) < 2:
        return False
    name = call.args[1]
    return (
        isinstance(name, ast.Constant)
        and isinstance(name.value, str)
        and not name.value.startswith("_")
    )
