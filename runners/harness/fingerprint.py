"""Which toolchain (and device) produced a result.

Computed inside the child, in the toolchain's own interpreter, before any
kernel code runs. ``hash`` covers only the toolchain components, so the same
toolchain on two hosts with different GPUs shares it; ``components`` also
names the device and host.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

TOOLCHAIN_KEYS = (
    "tilelang",
    "apache_tvm_ffi",
    "torch",
    "torch_cuda",
    "torch_hip",
    "nvcc",
    "hipcc",
    "driver",
    "python",
    "platform",
)
PROBE_CACHE_NAME = "compiler-probe.json"


def fingerprint(cache_dir: str | None = None) -> dict:
    components = {
        **_packages(),
        **_torch_components(),
        **_compilers(cache_dir),
        "driver": _driver_version(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": _platform(),
        "os_release": platform.release(),
    }
    return {"hash": toolchain_hash(components), "components": components}


def canonical_sha256(value) -> str:
    """sha256 of ``value`` as canonical JSON: how the matrix names a
    toolchain by its components (``matrix.models.fingerprint_of``)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def matrix_fingerprint(components: dict) -> str:
    """The fingerprint the matrix gives the toolchain with these components
    when a runner registers it (registration keeps the TOOLCHAIN_KEYS only),
    and so the one its manifests name."""
    return canonical_sha256({k: components.get(k) for k in TOOLCHAIN_KEYS})


def toolchain_hash(components: dict) -> str:
    toolchain = {k: components.get(k) for k in TOOLCHAIN_KEYS}
    return hashlib.sha256(json.dumps(toolchain, sort_keys=True).encode()).hexdigest()


def _packages() -> dict:
    versions = {}
    for dist in ("tilelang", "apache-tvm-ffi", "torch"):
        try:
            versions[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist.replace("-", "_")] = None
    return versions


def _torch_components() -> dict:
    """CUDA/HIP build of torch and the visible GPU, from an imported torch."""
    found = {"torch_cuda": None, "torch_hip": None, "gpu_name": None, "gpu_arch": None}
    # Imported here when the caller has not (a runner's inventory probe): the
    # hash must not depend on whether torch happened to be loaded already.
    try:
        import torch
    except ImportError:
        return found
    found["torch_cuda"] = torch.version.cuda
    found["torch_hip"] = getattr(torch.version, "hip", None)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found["gpu_name"] = props.name
        # CUDA builds of torch also have gcnArchName (holding the GPU name).
        if found["torch_hip"]:
            found["gpu_arch"] = props.gcnArchName
        else:
            found["gpu_arch"] = f"sm_{props.major}{props.minor}"
    return found


def _platform() -> str:
    libc, libc_version = platform.libc_ver()
    base = f"{platform.system()}-{platform.machine()}"
    return f"{base}-{libc}{libc_version}" if libc else base


def _driver_version() -> str | None:
    nvidia = Path("/proc/driver/nvidia/version")
    if nvidia.exists():
        match = re.search(
            r"Kernel Module\s+(?:for \S+\s+)?(\d[\d.]+)", nvidia.read_text()
        )
        return f"nvidia {match.group(1)}" if match else None
    amd = Path("/sys/module/amdgpu/version")
    if amd.exists():
        return f"amdgpu {amd.read_text().strip()}"
    return None


def _compilers(cache_dir: str | None) -> dict:
    """nvcc/hipcc versions, cached on disk by the binary's identity because
    running them costs tens of milliseconds per child."""
    binaries = {"nvcc": _find_tool("nvcc", "CUDA_HOME", "CUDA_PATH")}
    binaries["hipcc"] = _find_tool("hipcc", "ROCM_PATH", "ROCM_HOME")
    keys = {name: _identity(path) for name, path in binaries.items()}
    cache_file = Path(cache_dir) / PROBE_CACHE_NAME if cache_dir else None
    cached = _read_json(cache_file)
    if cached.get("keys") == keys:
        return cached["versions"]
    versions = {name: _tool_version(path) for name, path in binaries.items()}
    if cache_file:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps({"keys": keys, "versions": versions}))
        except OSError:
            pass  # a read-only cache only costs the probe next time
    return versions


def _find_tool(name: str, *home_vars: str) -> str | None:
    for var in home_vars:
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / name).exists():
            return str(Path(home) / "bin" / name)
    return shutil.which(name)


def _identity(path: str | None) -> list | None:
    if not path:
        return None
    real = os.path.realpath(path)
    stat = os.stat(real)
    return [real, stat.st_mtime_ns, stat.st_size]


def _tool_version(path: str | None) -> str | None:
    if not path:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release \S+ V([\d.]+)|HIP version:\s*(\S+)", out)
    if match:
        return match.group(1) or match.group(2)
    return out.strip().splitlines()[-1] if out.strip() else None


def _read_json(path: Path | None) -> dict:
    try:
        return json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}
