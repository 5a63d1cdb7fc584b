"""The admin site shows everything and changes little: records whose state
is a decision (reviews, current revisions and toolchains, jobs, results,
cells, the upgrade gate, runners, the audit log) change only through the
pages and commands, whose services check who may do it and audit it. What
stays editable (device types, shapes, users, groups, login lockouts) is
audited by the site itself (matrix.accounts.roles.AuditedAdmin)."""

from __future__ import annotations

from django.contrib import admin

from matrix import models


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never added, changed or deleted here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(models.DeviceType)
class DeviceTypeAdmin(admin.ModelAdmin):
    list_display = ["__str__", "vendor", "model", "arch", "backend", "memory_gb"]
    list_filter = ["backend", "vendor"]


@admin.register(models.Operator)
class OperatorAdmin(ReadOnlyAdmin):
    """Defined by the operator library (runners.kernels), seeded from it."""

    list_display = ["name", "dims"]


@admin.register(models.KernelRevision)
class KernelRevisionAdmin(ReadOnlyAdmin):
    """Reviewed on the submissions page, by a reviewer other than its author
    (matrix.submissions.kernel_review): approving makes it current."""

    list_display = ["operator", "source_sha256", "origin", "review_state", "is_current"]
    list_filter = ["origin", "review_state", "is_current"]


@admin.register(models.Shape)
class ShapeAdmin(admin.ModelAdmin):
    list_display = [
        "operator",
        "dims_key",
        "dtype",
        "served",
        "weight",
        "source_profile",
    ]
    list_filter = ["operator", "dtype", "served", "source_profile"]


@admin.register(models.Toolchain)
class ToolchainAdmin(ReadOnlyAdmin):
    """Registered by runners; current through an upgrade's rollout."""

    list_display = ["name", "tilelang_version", "fingerprint", "is_current"]


@admin.register(models.ValidationJob)
class ValidationJobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "shape",
        "device_type",
        "toolchain",
        "state",
        "attempt",
        "runner",
    ]
    list_filter = ["state", "stage"]
    raw_id_fields = ["shape", "revision", "sweep", "runner"]


@admin.register(models.Result)
class ResultAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "shape",
        "device_type",
        "toolchain",
        "status",
        "rel_err",
        "kernel_ms",
    ]
    list_filter = ["status"]
    raw_id_fields = ["job", "shape", "revision"]


@admin.register(models.Cell)
class CellAdmin(ReadOnlyAdmin):
    list_display = ["shape", "device_type", "toolchain", "status", "updated_at"]
    list_filter = ["status"]
    raw_id_fields = ["shape", "result", "revision"]


@admin.register(models.AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Append-only."""

    list_display = ["created_at", "actor_label", "verb", "object_type", "object_id"]
    list_filter = ["verb"]


# Gate records change only through matrix.gate.services, which audits every
# transition.


@admin.register(models.Policy)
class PolicyAdmin(ReadOnlyAdmin):
    list_display = [
        "version",
        "required_approvals",
        "perf_budget",
        "speed_budget",
        "created_by",
        "created_at",
    ]


@admin.register(models.UpgradeProposal)
class UpgradeProposalAdmin(ReadOnlyAdmin):
    list_display = ["id", "baseline", "candidate", "proposer", "state", "created_at"]
    list_filter = ["state"]


@admin.register(models.Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ["proposal", "reviewer", "decision", "voided", "created_at"]
    list_filter = ["decision", "voided"]


@admin.register(models.BackendException)
class BackendExceptionAdmin(ReadOnlyAdmin):
    list_display = ["proposal", "backend", "granted_by", "signed_off_by"]


@admin.register(models.ManifestEntry)
class ManifestEntryAdmin(ReadOnlyAdmin):
    list_display = ["toolchain", "operator", "dtype", "device_type", "dims", "choice"]
    list_filter = ["choice", "toolchain"]
