from __future__ import annotations

from django.contrib import admin

from runners import models, services


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

    def get_readonly_fields(self, request, obj=None):
        # A revoked runner stays revoked: its health is not set again.
        if obj is not None and obj.revoked_at is not None:
            return [*self.readonly_fields, "health"]
        return self.readonly_fields

    def save_model(self, request, obj, form, change):
        # A change of health is the runners page's transition: audited, and
        # ending maintenance sends the runner's queued jobs again.
        health = obj.health
        if change and "health" in form.changed_data:
            obj.health = form.initial["health"]
        super().save_model(request, obj, form, change)
        if obj.health != health:
            services.runner_health_set(runner=obj, health=health, by=request.user)


@admin.register(models.RegistrationToken)
class RegistrationTokenAdmin(admin.ModelAdmin):
    list_display = ["__str__", "created_by", "created_at", "expires_at", "used_at"]
    readonly_fields = ["digest", "used_at", "used_by"]
