"""Fixtures for the harness tests: real TileLang, real child processes.

Trusted (library) jobs share a persistent kernel cache under var/ so reruns
skip compilation; submitted kernels always get a throwaway one.
"""

from __future__ import annotations

import pytest

from tests.harness.helpers import CACHE_ROOT, PLANTED


@pytest.fixture(scope="session")
def cache_dir() -> str:
    path = CACHE_ROOT / "tests-tilelang-0.1.15"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


@pytest.fixture(scope="module")
def planted_secrets():
    """Secrets in the supervisor's environment, as on a runner host that also
    holds the service's credentials."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in PLANTED.items():
            patch.setenv(name, value)
        yield PLANTED
