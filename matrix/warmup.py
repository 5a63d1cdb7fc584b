"""Make a new web worker as fast on its first requests as on its later ones.

A worker imports each view's modules and compiles each template on the
first request that needs them: at 1M results, the first view of the gaps
page in each of gunicorn's workers took 40-70 ms more than the next, which
put it in the page's p95 (and every worker restarts after --max-requests).
``warm_up()`` does that work when the worker loads the application, before
it takes a request; it reads no data.
"""

from __future__ import annotations

from pathlib import Path

from django.template import engines
from django.urls import get_resolver


def warm_up() -> int:
    """Import every view and compile every project template; returns the
    number of templates compiled."""
    get_resolver().url_patterns  # noqa: B018 (imports every view module)
    compiled = 0
    for engine in engines.all():
        for root in engine.dirs:
            for path in sorted(Path(root).rglob("*.html")):
                engine.get_template(path.relative_to(root).as_posix())
                compiled += 1
    return compiled
