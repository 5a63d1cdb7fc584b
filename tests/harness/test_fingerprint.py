"""The toolchain hash changes with any toolchain component and not with the
device it ran on."""

from __future__ import annotations

from runners.harness.fingerprint import fingerprint, toolchain_hash


def test_it_names_this_toolchain(tmp_path):
    found = fingerprint(str(tmp_path))
    components = found["components"]
    assert components["tilelang"] == "0.1.15"
    assert components["python"].startswith("CPython 3.")
    assert found["hash"] == toolchain_hash(components)
    # The compiler probe is cached by the binary's identity.
    assert fingerprint(str(tmp_path)) == found


def test_the_hash_covers_the_toolchain_and_not_the_device():
    components = {"tilelang": "0.1.15", "nvcc": "13.0.88", "gpu_name": "NVIDIA H200"}
    base = toolchain_hash(components)
    assert toolchain_hash({**components, "gpu_name": "NVIDIA H100"}) == base
    assert toolchain_hash({**components, "os_release": "6.9"}) == base
    assert toolchain_hash({**components, "tilelang": "0.1.13"}) != base
    assert toolchain_hash({**components, "nvcc": "12.8.93"}) != base
