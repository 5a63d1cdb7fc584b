"""The static pre-check refuses a kernel source that reaches the process, the
environment or the harness, however it spells the way there: re-exports of
an allowed module, attributes, names handed to getattr. It is defence in
depth; the sandbox and the judge hold without it."""

from __future__ import annotations

import pytest

from runners.harness.precheck import precheck
from tests.security.helpers import attack_source

TEMPLATE = """import operator

import tilelang
import tilelang.language as T

{line}


def program(shape, dtype, target):
    return None
"""


@pytest.mark.parametrize(
    "line, rule",
    [
        ("from tilelang.env import os", "from tilelang.env import os"),
        ("from tilelang.env import sys as s", "from tilelang.env import sys"),
        (
            "from tilelang.contrib.nvcc import subprocess",
            "from tilelang.contrib.nvcc import subprocess",
        ),
        ("from tilelang.env import *", "from tilelang.env import *"),
        ("from tilelang.utils import open", "from tilelang.utils import open"),
        ("from operator import attrgetter", "from operator import attrgetter"),
        ("e = getattr(tilelang.env, 'environ')", "getattr 'environ'"),
        ("m = getattr(tilelang.env, 'sys')", "getattr 'sys'"),
        ("h = hasattr(tilelang, 'modules')", "hasattr 'modules'"),
        ("e = getattr(tilelang, 'env' + 'iron')", "getattr"),
        ("lookup = getattr", "getattr"),
        ("e = operator.attrgetter('environ')(tilelang.env)", ".attrgetter"),
        ("m = tilelang.env.sys.modules", ".sys"),
        ("run = tilelang.contrib.nvcc.subprocess.run", ".subprocess"),
        ("t = T.modules", ".modules"),
        ("o = __import__('os')", "__import__"),
        ("import importlib", "import importlib"),
        ("from importlib import import_module", "import importlib"),
        ("import tilelang.env.os", "import tilelang.env.os"),
    ],
)
def test_a_way_out_is_refused_however_it_is_spelled(line, rule):
    refusals = precheck(TEMPLATE.format(line=line))
    assert rule in [r.rule for r in refusals], refusals


def test_the_forger_of_the_report_is_refused_at_its_reexport():
    refusals = precheck(attack_source("patch_tensors"))
    assert refusals[0].rule == "from tilelang.env import sys"
    assert "a re-export of sys" in refusals[0].reason
    assert refusals[0].line == 7


@pytest.mark.parametrize(
    "line",
    [
        "kernel = getattr(T, 'Kernel')",
        "from tilelang.language import Kernel, Parallel",
        "import tilelang.language",
    ],
)
def test_a_plain_kernel_passes(line):
    assert precheck(TEMPLATE.format(line=line)) == []
    assert precheck(attack_source("good_add")) == []
