"""A static pre-check of submitted kernel sources (stdlib ``ast`` only).

A TileLang kernel needs ``tilelang`` and a little arithmetic; anything that
reaches the process, the files, the network, the clock, the environment or
the harness is refused with the rule that caught it, however it is spelled:
imported (``import os``), re-exported by an allowed module (``from
tilelang.env import sys``), reached as an attribute (``tilelang.env.os``) or
by name (``getattr(o, "environ")``, ``operator.attrgetter``). This is
defence in depth: the sandbox is the boundary, and a source that passes here
still runs only there, in a process that judges nothing (a Python check
cannot see every dynamic trick).
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
# Attributes (and names imported from any module) that reach what a kernel
# must not, whichever module offers them.
ATTRIBUTE_REASONS = {
    "modules": "modules reaches every loaded module, the harness's included",
    "system": "system runs shell commands",
    "popen": "popen runs shell commands",
    "fork": "fork starts processes",
    "forkpty": "forkpty starts processes",
    "kill": "kill signals processes",
    "killpg": "killpg signals processes",
    "posix_spawn": "posix_spawn starts programs",
    "posix_spawnp": "posix_spawnp starts programs",
    "import_module": "import_module loads arbitrary modules",
    "load_module": "load_module loads arbitrary modules",
    "exec_module": "exec_module runs arbitrary modules",
    "attrgetter": "attrgetter hides attribute access",
    "methodcaller": "methodcaller hides attribute access",
    "get_type_hints": "get_type_hints evaluates strings as code",
    "f_globals": "frames reach the harness's namespaces",
    "f_locals": "frames reach the harness's namespaces",
    "f_back": "frames reach the harness's namespaces",
    "f_builtins": "frames reach the builtins",
    "gi_frame": "frames reach the harness's namespaces",
    "cr_frame": "frames reach the harness's namespaces",
    "tb_frame": "frames reach the harness's namespaces",
}
for _name_ in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp"):
    ATTRIBUTE_REASONS[_name_] = f"{_name_} replaces the process with another program"
for _name_ in ("spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle"):
    ATTRIBUTE_REASONS[_name_] = f"{_name_} starts programs"


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
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    refusals: list[Refusal] = []
    for node in ast.walk(tree):
        refusals += _check(node, called)
    if not any(
        isinstance(n, ast.FunctionDef) and n.name == "program" for n in tree.body
    ):
        refusals.append(
            Refusal(
                1, "program", "the source must define program(shape, dtype, target)"
            )
        )
    return sorted(refusals, key=lambda r: (r.line, r.rule))


def _check(node: ast.AST, called: set[int]) -> list[Refusal]:
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Import):
        return [r for alias in node.names if (r := _module(alias.name, line))]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return [
                Refusal(line, "import", "relative imports reach the harness package")
            ]
        refusal = _module(node.module or "", line)
        return ([refusal] if refusal else []) + _imported_names(node, line)
    if isinstance(node, ast.Attribute):
        reason = _dangerous(node.attr)
        return [Refusal(line, f".{node.attr}", reason)] if reason else []
    if isinstance(node, ast.Name):
        refusals = _name(node.id, line)
        if node.id in ATTRIBUTE_FUNCTIONS and id(node) not in called:
            refusals.append(
                Refusal(
                    line, node.id, f"{node.id} passed around hides attribute access"
                )
            )
        return refusals
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in ATTRIBUTE_FUNCTIONS:
            return _attribute_call(node, line)
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


def _imported_names(node: ast.ImportFrom, line: int) -> list[Refusal]:
    """What ``from M import X`` brings in, whatever M is: an allowed module
    may re-export os, sys or subprocess (``from tilelang.env import sys``)."""
    refusals = []
    for alias in node.names:
        rule = f"from {node.module} import {alias.name}"
        if alias.name == "*":
            reason = "a star import brings in whatever the module holds, os or sys too"
        else:
            reason = CALL_REASONS.get(alias.name) or _dangerous(alias.name)
            if reason and alias.name in MODULE_REASONS:
                reason = f"a re-export of {alias.name}: {reason}"
        if reason:
            refusals.append(Refusal(line, rule, reason))
    return refusals


def _dangerous(name: str) -> str | None:
    """Why an attribute or an imported name called ``name`` is refused."""
    if name.startswith("__") and name.endswith("__"):
        return (
            "dunder attributes reach interpreter internals "
            "(__builtins__, __subclasses__, __globals__, ...)"
        )
    if name in ENVIRONMENT_NAMES:
        return "the environment is not the kernel's"
    if name in MODULE_REASONS:
        return f"reaches {name} through another module: {MODULE_REASONS[name]}"
    return ATTRIBUTE_REASONS.get(name)


def _attribute_call(call: ast.Call, line: int) -> list[Refusal]:
    """getattr and its kin may name a plain attribute that is not dangerous,
    spelled out as a string; a computed name could be anything."""
    function = call.func.id
    name = call.args[1] if len(call.args) >= 2 else None
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        reason = f"{function} with a computed name hides attribute access"
        return [Refusal(line, function, reason)]
    if name.value.startswith("_"):
        reason = f"{function} with a private or dunder name reaches internals"
        return [Refusal(line, f"{function} {name.value!r}", reason)]
    reason = _dangerous(name.value)
    return [Refusal(line, f"{function} {name.value!r}", reason)] if reason else []


def _name(name: str, line: int) -> list[Refusal]:
    if name in CALL_REASONS:
        return [Refusal(line, name, CALL_REASONS[name])]
    if name.startswith("__") and name.endswith("__") and name not in ("__name__",):
        return [Refusal(line, name, "dunder names reach interpreter internals")]
    if name in ENVIRONMENT_NAMES:
        return [Refusal(line, name, "the environment is not the kernel's")]
    return []
