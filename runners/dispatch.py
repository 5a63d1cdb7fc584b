"""Choose TileLang or the PyTorch reference from an approved manifest.

Production code imports this module without Django: it reads the JSON that
``GET /api/v1/manifest`` or ``manage.py export_manifest`` wrote. The TileLang
kernel runs only where the manifest chose it: that exact operator, dtype,
device type, toolchain fingerprint and shape validated, measured no slower
than the PyTorch reference there (beyond the policy's speed budget) and
approved, and, given the kernel revisions this host runs, that
revision; every other call takes the reference and logs why ("pass, but
0.69× of the reference") once per (operator, dtype, dims), with shapes and
never values.

    device = device_type_label(vendor="x86-64", model="CPU", backend="c")
    dispatcher = Dispatcher.from_file("manifest.json", device_type=device,
                                      toolchain_fingerprint=host_toolchain_fingerprint(),
                                      kernel_revisions=library_revisions("softmax"))
    out = dispatcher.call("softmax", {"M": 64, "N": 256}, "float32",
                          tilelang=kernel, reference=torch_softmax, args=(x,))

Without ``kernel_revisions`` the revision is not checked: evidence for one
revision then vouches for whatever kernel the caller passes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("tilematrix.dispatch")

FORMAT = "tilematrix-manifest/1"
TILELANG = "tilelang"
REFERENCE = "reference"


@dataclass(frozen=True)
class Decision:
    choice: str  # TILELANG or REFERENCE
    reason: str
    kernel_sha256: str = ""

    @property
    def uses_tilelang(self) -> bool:
        return self.choice == TILELANG


def device_type_label(*, vendor: str, model: str, arch: str = "", backend: str) -> str:
    """The device type name the manifest uses (matrix.models.DeviceType's
    str), built from what a production host knows about itself."""
    return " · ".join(p for p in (f"{vendor} {model}", arch, backend) if p)


def host_toolchain_fingerprint(cache_dir: str | None = None) -> str:
    """This process's toolchain (TileLang, TVM-FFI, torch and its CUDA/HIP,
    nvcc/hipcc, driver, Python, platform) as the matrix fingerprints a
    runner's, so the manifest of the toolchain validated here matches it.
    Probes the device compilers once per ``cache_dir``."""
    from runners.harness.fingerprint import fingerprint, matrix_fingerprint

    return matrix_fingerprint(fingerprint(cache_dir)["components"])


def library_revisions(*operators: str) -> dict[str, str]:
    """The revisions of this host's copy of library operators, as the
    manifest names them (read from the modules, never imported)."""
    from runners.kernels.revision import library_sha256

    revisions = {}
    for name in operators:
        digest = library_sha256(name)
        if digest is None:
            raise ValueError(f"no library operator named {name!r}")
        revisions[name] = digest
    return revisions


def _dims_key(dims: dict) -> tuple:
    return tuple(sorted((str(k), int(v)) for k, v in dims.items()))


ENTRY_FIELDS = ("operator", "dtype", "device_type", "shape_rule", "choice")


def _entry_key(index: int, entry) -> tuple:
    where = f"manifest entry {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    missing = [f for f in ENTRY_FIELDS if f not in entry]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    dims = (
        entry["shape_rule"].get("dims")
        if isinstance(entry["shape_rule"], dict)
        else None
    )
    try:
        dims_key = _dims_key(dims)
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"{where}: shape_rule.dims must map dims to ints") from None
    return (entry["operator"], entry["dtype"], entry["device_type"], dims_key)


class Dispatcher:
    """The manifest of one toolchain, seen from one device type."""

    def __init__(
        self,
        manifest: dict,
        *,
        device_type: str,
        toolchain_fingerprint: str,
        kernel_revisions: Mapping[str, str] | None = None,
    ):
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else manifest
            raise ValueError(f"not a {FORMAT} manifest: {found!r}")
        toolchain = manifest.get("toolchain")
        if not isinstance(toolchain, dict) or not toolchain.get("fingerprint"):
            raise ValueError("the manifest names no toolchain fingerprint")
        entries = manifest.get("entries", [])
        if not isinstance(entries, list):
            raise ValueError("the manifest's entries must be a list")
        self.device_type = device_type
        self.toolchain_fingerprint = toolchain_fingerprint
        self.kernel_revisions = (
            dict(kernel_revisions) if kernel_revisions is not None else None
        )
        self.manifest_fingerprint = toolchain["fingerprint"]
        self.manifest_toolchain = toolchain.get("name", "")
        self._entries: dict[tuple, dict] = {}
        self._devices: set[str] = set()
        for index, entry in enumerate(entries):
            key = _entry_key(index, entry)
            self._devices.add(entry["device_type"])
            self._entries[key] = entry
        # One decision per (operator, dtype, dims), and one log line for it:
        # a served model calls the same shapes thousands of times a second.
        self._decided: dict[tuple, Decision] = {}

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> Dispatcher:
        return cls(json.loads(Path(path).read_text()), **kwargs)

    def entries_choosing_tilelang(self) -> list[tuple[str, dict, str]]:
        """The (operator, dims, dtype) the manifest approves as TileLang for
        this device type, whatever this host's toolchain and revisions."""
        return [
            (operator, dict(dims), dtype)
            for (operator, dtype, device_type, dims), entry in self._entries.items()
            if device_type == self.device_type and entry["choice"] == TILELANG
        ]

    def tilelang_cells(self) -> list[tuple[str, dict, str]]:
        """The (operator, dims, dtype) cells this host runs by TileLang: the
        manifest's cells of this device type that ``decide`` serves so."""
        return [
            cell
            for cell in self.entries_choosing_tilelang()
            if self.decide(*cell).uses_tilelang
        ]

    def decide(self, operator: str, dims: dict, dtype: str) -> Decision:
        return self._lookup(operator, dims, dtype)[0]

    def _lookup(self, operator: str, dims: dict, dtype: str) -> tuple[Decision, bool]:
        """The decision, and whether it was made just now (not kept)."""
        try:
            key = (operator, dtype, _dims_key(dims))
        except (AttributeError, TypeError, ValueError):
            reason = f"shape {dims!r} is not a dict of int dims"
            return Decision(REFERENCE, reason), True
        decision = self._decided.get(key)
        if decision is not None:
            return decision, False
        decision = self._decided[key] = self._decide(operator, dims, dtype, key)
        return decision, True

    def _decide(self, operator: str, dims: dict, dtype: str, key: tuple) -> Decision:
        if self.toolchain_fingerprint != self.manifest_fingerprint:
            return Decision(
                REFERENCE,
                f"toolchain {self.toolchain_fingerprint[:12]} is not the one "
                f"validated ({self.manifest_toolchain} "
                f"{self.manifest_fingerprint[:12]})",
            )
        if self.device_type not in self._devices:
            return Decision(
                REFERENCE, f"device type {self.device_type!r} was never validated"
            )
        entry = self._entries.get((operator, dtype, self.device_type, key[2]))
        if entry is None:
            return Decision(
                REFERENCE,
                f"{operator} {dtype} shape {dict(dims)} has no approved entry "
                f"for {self.device_type}",
            )
        if entry["choice"] != TILELANG:
            return Decision(REFERENCE, entry.get("reason") or "approved as reference")
        validated = entry.get("kernel_sha256", "")
        if self.kernel_revisions is not None:
            here = self.kernel_revisions.get(operator)
            if here is None:
                return Decision(
                    REFERENCE, f"no kernel revision of {operator} is given here"
                )
            if here != validated:
                return Decision(
                    REFERENCE,
                    f"{operator}'s kernel here ({here[:12]}) is not the revision "
                    f"validated ({validated[:12]})",
                )
        return Decision(TILELANG, entry.get("reason", ""), validated)

    def call(
        self,
        operator: str,
        dims: dict,
        dtype: str,
        *,
        tilelang: Callable,
        reference: Callable,
        args: Sequence = (),
    ):
        """Run the chosen implementation on ``args``. A fallback is logged
        the first time its (operator, dtype, dims) is called, with the
        argument shapes only."""
        decision, new = self._lookup(operator, dims, dtype)
        if decision.uses_tilelang:
            return tilelang(*args)
        if new:
            logger.info(
                "reference fallback for %s %s dims=%s arg_shapes=%s on %s: %s",
                operator,
                dtype,
                dict(dims),
                [tuple(getattr(a, "shape", ())) for a in args],
                self.device_type,
                decision.reason,
            )
        return reference(*args)
