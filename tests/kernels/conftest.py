"""Fixtures for the kernel library tests: real TileLang, no Django.

TileLang reads ``TILELANG_CACHE_DIR`` once, when it is first imported, so it
is set here before any test module imports tilelang; a persistent directory
keeps reruns from recompiling every kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TILELANG_CACHE_DIR", str(REPO / "var" / "tilelang-cache-tests"))

CUDA = {"kind": "cuda", "arch": "sm_90a"}
HIP = {"kind": "hip", "mcpu": "gfx942"}
METAL = {"kind": "metal"}
C = {"kind": "c"}


@pytest.fixture(scope="session")
def tilelang():
    return pytest.importorskip("tilelang")
