from __future__ import annotations

from django.contrib import admin

from matrix.admin import ReadOnlyAdmin
from matrix.fleet import models


@admin.register(models.Runner)
class RunnerAdmin(ReadOnlyAdmin):
    """Approval, maintenance and revocation are the Runners page's and the
    `runner` command's: audited, and ending maintenance sends the runner's
    queued jobs again. What a runner claims (devices, toolchains, inventory)
    is what a runner admin approved: not edited afterwards."""

    list_display = ["name", "state", "health", "last_heartbeat", "revoked_at"]
    list_filter = ["state", "health"]


@admin.register(models.RegistrationToken)
class RegistrationTokenAdmin(ReadOnlyAdmin):
    """Made on the Runners page or with `runner token create` (audited)."""

    list_display = ["__str__", "created_by", "created_at", "expires_at", "used_at"]
