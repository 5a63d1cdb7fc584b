from __future__ import annotations

from django.contrib import admin

from runners import models


@admin.register(models.Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "health", "last_heartbeat", "revoked_at"]
    list_filter = ["state", "health"]
    readonly_fields = [
        "public_key",
        "state",
        "last_heartbeat",
        "last_sequence",
        "revoked_at",
    ]


@admin.register(models.RegistrationToken)
class RegistrationTokenAdmin(admin.ModelAdmin):
    list_display = ["__str__", "created_by", "created_at", "expires_at", "used_at"]
    readonly_fields = ["digest", "used_at", "used_by"]
