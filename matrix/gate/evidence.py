"""The upgrades an evidence file holds: a lab runner that validated the same
device type with two TileLang releases ran an A/B, which the demo opens as a
proposal (older release → newer) once the file is imported."""

from __future__ import annotations

from dataclasses import dataclass, field

from matrix.models import DeviceType, JobStage, Toolchain
from matrix.queries import release_of


@dataclass
class EvidenceUpgrade:
    baseline: Toolchain
    candidate: Toolchain
    device_types: list[DeviceType] = field(default_factory=list)

    def __str__(self) -> str:
        where = ", ".join(str(dt) for dt in self.device_types)
        return f"{self.baseline} → {self.candidate} on {where}"


def evidence_upgrades(data: dict) -> list[EvidenceUpgrade]:
    """Per pair of toolchains of different TileLang releases that both
    validated a device type in the file, the upgrade from the older to the
    newer on every such device type. Toolchains and device types are this
    server's (the file imported); one it does not know is left out."""
    validated: dict[tuple, set[str]] = {}
    for job in data.get("jobs") or []:
        if not isinstance(job, dict) or job.get("stage") != JobStage.VALIDATE:
            continue
        device = job.get("device")
        if isinstance(device, dict) and isinstance(job.get("toolchain"), str):
            key = tuple(sorted((str(k), str(v)) for k, v in device.items()))
            validated.setdefault(key, set()).add(job["toolchain"])
    toolchains = Toolchain.objects.in_bulk(
        set().union(*validated.values()) if validated else set(),
        field_name="fingerprint",
    )
    device_types = list(DeviceType.objects.all())
    upgrades: dict[tuple[int, int], EvidenceUpgrade] = {}
    for device, fingerprints in sorted(validated.items()):
        found = [d for d in device_types if _is(d, dict(device))]
        ranked = sorted(
            (toolchains[f] for f in fingerprints if f in toolchains),
            key=lambda t: release_of(t.tilelang_version) or (),
        )
        if not found or len(ranked) < 2:
            continue
        for older, newer in zip(ranked, ranked[1:], strict=False):
            if release_of(older.tilelang_version) == release_of(newer.tilelang_version):
                continue
            upgrade = upgrades.setdefault(
                (older.pk, newer.pk), EvidenceUpgrade(older, newer)
            )
            upgrade.device_types.append(found[0])
    return list(upgrades.values())


def _is(device_type: DeviceType, device: dict) -> bool:
    return all(str(getattr(device_type, k, "")) == v for k, v in device.items())
