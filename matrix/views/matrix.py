from __future__ import annotations

from django.shortcuts import render

from matrix.models import DeviceType, Operator, Shape


def matrix_page(request):
    operators = Operator.objects.all()
    shapes = Shape.objects.select_related("operator").by_weight()
    device_types = DeviceType.objects.all()
    return render(
        request,
        "matrix/matrix.html",
        {"operators": operators, "shapes": shapes, "device_types": device_types},
    )
