from __future__ import annotations

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "matrix.observability"
    label = "observability"
    verbose_name = "Observability"

    def ready(self):
        from matrix.observability import ingest  # noqa: F401 (connects its receiver)
