from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix.settings")
application = get_wsgi_application()

# Before the first request, not during it (see matrix.warmup).
from matrix.warmup import warm_up  # noqa: E402

warm_up()
