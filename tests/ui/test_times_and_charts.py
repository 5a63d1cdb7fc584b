"""Times as people read them, and the server-drawn charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from matrix.queries import issued_time
from matrix.templatetags.matrix_extras import ago, percent_text, when
from matrix.views.charts import TimeSeries, log_ticks, time_chart

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=20), "just now"),
        (timedelta(minutes=5, seconds=59), "5 min ago"),
        (timedelta(hours=3, minutes=50), "3 h ago"),
        (timedelta(days=2, hours=23), "2 d ago"),
        (timedelta(days=65), "2 mo ago"),
        (timedelta(days=400), "1 y ago"),
        (-timedelta(minutes=7), "in 7 min"),
    ],
)
def test_a_time_reads_relative_to_now(delta, text):
    assert ago(NOW - delta, now=NOW) == text


def test_the_absolute_time_is_on_hover():
    html = when(datetime(2026, 12, 1, 21, 38, 48, tzinfo=UTC))
    assert 'datetime="2026-12-01T21:38:48Z"' in html
    assert 'title="2026-12-01 21:38:48 UTC"' in html
    assert when(None) == "—"


def test_the_signed_time_wins_over_the_stored_one():
    stored = NOW
    assert issued_time("2026-12-01T21:38:48+00:00", stored) == datetime(
        2026, 12, 1, 21, 38, 48, tzinfo=UTC
    )
    # No envelope, or one that says nothing usable: the stored time.
    assert issued_time(None, stored) is stored
    assert issued_time("yesterday", stored) is stored
    assert issued_time("2026-12-01T21:38:48", stored) is stored  # no zone


def test_one_point_is_drawn_as_a_point():
    chart = time_chart(
        "one", "ms", [TimeSeries("kernel", "kernel", "circle", [(NOW, 0.5)])]
    )
    assert chart.count("<circle") == 1 and "<polyline" not in chart
    assert time_chart("none", "ms", [TimeSeries("k", "kernel", "circle", [])]) is None


def test_values_over_a_decade_apart_get_a_log_axis():
    points = [(NOW - timedelta(days=i), v) for i, v in enumerate((0.01, 0.1, 1.0))]
    chart = time_chart("wide", "ms", [TimeSeries("k", "kernel", "square", points)])
    assert ">0.01 ms</text>" in chart and ">1 ms</text>" in chart
    assert chart.count('<rect class="kernel mark"') == 3


def test_log_ticks_are_round_numbers():
    import math

    ticks = [round(10**t, 6) for t in log_ticks(math.log10(0.015), math.log10(0.3))]
    assert ticks == [0.02, 0.05, 0.1, 0.2]


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0%"), (0.4, "<1%"), (50.5, "50%"), (99.6, ">99%"), (100, "100%")],
)
def test_a_share_never_rounds_a_part_away(value, text):
    assert percent_text(value) == text
