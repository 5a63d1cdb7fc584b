"""A new web worker warms up before its first request (matrix/warmup.py,
called by matrix/wsgi.py): its first views compile no template."""

from __future__ import annotations

import pytest
from django.template import engines
from django.template.base import Template

from matrix.warmup import warm_up
from tests.ui.test_cells import cell_url


@pytest.fixture
def compiled(monkeypatch) -> list:
    """The names of the templates compiled from here on, starting from a
    worker that has compiled none."""
    for engine in engines.all():
        for loader in engine.engine.template_loaders:
            if hasattr(loader, "reset"):
                loader.reset()
    names = []
    original = Template.__init__

    def counting(self, template_string, origin=None, name=None, engine=None):
        names.append(name)
        original(self, template_string, origin, name, engine)

    monkeypatch.setattr(Template, "__init__", counting)
    return names


def pages(client, results, device_types) -> None:
    for url in ("/", "/gaps/", "/errors/", cell_url(results["top"], "c", device_types)):
        assert client.get(url).status_code == 200


def test_a_warmed_worker_compiles_no_template_on_its_first_views(
    client, viewer, results, device_types, compiled
):
    assert warm_up() >= 20
    compiled.clear()
    client.force_login(viewer)
    pages(client, results, device_types)
    assert compiled == []


def test_a_cold_worker_compiles_them_on_its_first_views(
    client, viewer, results, device_types, compiled
):
    client.force_login(viewer)
    pages(client, results, device_types)
    assert "matrix/gaps.html" in compiled and "base.html" in compiled


def test_a_workers_loaded_application_is_out_of_the_collectors_sight():
    """gunicorn loads matrix.wsgi in each worker: what it loaded is frozen,
    so a full garbage collection under load does not walk it."""
    import os
    import subprocess
    import sys

    counted = subprocess.run(
        [sys.executable, "-c", "import gc, matrix.wsgi; print(gc.get_freeze_count())"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "matrix.settings"},
    )
    assert int(counted.stdout.split()[-1]) > 50_000
