from __future__ import annotations

from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "matrix.observability"
    label = "observability"
    verbose_name = "Observability"
