from __future__ import annotations

import pytest

from matrix.fleet import bulk  # noqa: F401  (registers the ``any`` lookup)
from matrix.models import Shape

pytestmark = pytest.mark.django_db


def test_any_matches_what_in_matches(catalog):
    ids = list(Shape.objects.order_by("pk").values_list("pk", flat=True)[:5])
    wanted = [ids[0], ids[3], None, ids[3], 10**9]
    assert list(Shape.objects.filter(pk__any=wanted).order_by("pk")) == list(
        Shape.objects.filter(pk__in=wanted).order_by("pk")
    )
    assert Shape.objects.filter(pk__any=wanted).count() == 2


def test_any_of_nothing_matches_nothing_and_updates_nothing(catalog):
    assert not Shape.objects.filter(pk__any=[]).exists()
    assert not Shape.objects.filter(pk__any=[None]).exists()
    assert Shape.objects.filter(pk__any=[]).update(weight=2.0) == 0


def test_any_works_on_text_and_through_a_relation(catalog):
    shape = Shape.objects.select_related("operator").first()
    names = [shape.operator.name, "no-such-operator"]
    assert Shape.objects.filter(operator__name__any=names).count() == (
        Shape.objects.filter(operator=shape.operator).count()
    )
    assert shape in Shape.objects.filter(operator__pk__any=[shape.operator_id])
