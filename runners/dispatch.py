"""Choose TileLang or the PyTorch reference from an approved manifest.

Production code imports this module without Django: it reads the JSON that
``GET /api/v1/manifest`` or ``manage.py export_manifest`` wrote. The TileLang
kernel runs only where the manifest says that exact operator, dtype, device
type, toolchain fingerprint and shape were validated and approved; every
other call takes the reference and logs why, with shapes and never values.

    device = device_type_label(vendor="x86-64", model="CPU", backend="c")
    dispatcher = Dispatcher.from_file("manifest.json", device_type=device,
                                      toolchain_fingerprint=fingerprint)
    out = dispatcher.call("softmax", {"M": 64, "N": 256}, "float32",
                          tilelang=kernel, reference=torch_softmax, args=(x,))
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
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


def _dims_key(dims: dict) -> tuple:
    return tuple(sorted((str(k), int(v)) for k, v in dims.items()))


class Dispatcher:
    """The manifest of one toolchain, seen from one device type."""

    def __init__(self, manifest: dict, *, device_type: str, toolchain_fingerprint: str):
        if manifest.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest: {manifest.get('format')!r}")
        self.device_type = device_type
        self.toolchain_fingerprint = toolchain_fingerprint
        self.manifest_fingerprint = manifest["toolchain"]["fingerprint"]
        self.manifest_toolchain = manifest["toolchain"].get("name", "")
        self._entries: dict[tuple, dict] = {}
        self._devices: set[str] = set()
        for entry in manifest.get("entries", []):
            self._devices.add(entry["device_type"])
            key = (
                entry["operator"],
                entry["dtype"],
                entry["device_type"],
                _dims_key(entry["shape_rule"]["dims"]),
            )
            self._entries[key] = entry

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> Dispatcher:
        return cls(json.loads(Path(path).read_text()), **kwargs)

    def decide(self, operator: str, dims: dict, dtype: str) -> Decision:
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
        try:
            key = (operator, dtype, self.device_type, _dims_key(dims))
        except (TypeError, ValueError):
            return Decision(REFERENCE, f"shape {dims!r} is not a dict of int dims")
        entry = self._entries.get(key)
        if entry is None:
            return Decision(
                REFERENCE,
                f"{operator} {dtype} shape {dict(dims)} has no approved entry "
                f"for {self.device_type}",
            )
        if entry["choice"] != TILELANG:
            return Decision(REFERENCE, entry.get("reason") or "approved as reference")
        return Decision(
            TILELANG, entry.get("reason", ""), entry.get("kernel_sha256", "")
        )

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
        with the operator, dtype, dims and argument shapes only."""
        decision = self.decide(operator, dims, dtype)
        if decision.uses_tilelang:
            return tilelang(*args)
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
