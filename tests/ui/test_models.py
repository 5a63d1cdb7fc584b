"""The Models page and GET /api/v1/models: per served model and device type,
the share of its weighted calls per forward step that runs TileLang, falls
back to the reference, or is not validated yet."""

from __future__ import annotations

import csv
import hashlib
import io
import re

import pytest
from django.urls import reverse

from matrix.models import (
    DeviceType,
    KernelRevision,
    ServedCall,
    Shape,
    Status,
    Toolchain,
)
from tests.ui.conftest import record

pytestmark = pytest.mark.django_db


def shape(operator: str, dtype: str = "float16", **dims) -> Shape:
    key = ",".join(f"{k}={v}" for k, v in dims.items())
    return Shape.objects.get(operator__name=operator, dims_key=key, dtype=dtype)


@pytest.fixture
def served(results, toolchains, device_types):
    """Two models sharing a shape, each with its own count, and the H200
    column in every state a model can meet:

    alpha (100 calls): gemm M=1 10 (pass 1.2x: TileLang), rmsnorm M=1 30
    (pass at 0.69x: reference), softmax 7x33 10 (unsupported: reference),
    gemm M=4096 20 (compile error: reference), rmsnorm M=4096 30 (never
    run); beta (100 calls): gemm M=1 40 (TileLang), softmax 512 60 (only
    lowered)."""
    _, current = toolchains
    cuda = device_types["cuda"]
    gemm_1 = shape("gemm", M=1, N=6144, K=4096)
    gemm_big = shape("gemm", M=4096, N=6144, K=4096)
    norm_1 = shape("rmsnorm", M=1, N=4096)
    norm_big = shape("rmsnorm", M=4096, N=4096)
    soft_small = shape("softmax", M=7, N=33)
    soft_big = shape("softmax", M=512, N=32000)
    record(gemm_1, cuda, current, Status.PASS, kernel_ms=1.0, reference_ms=1.2)
    record(norm_1, cuda, current, Status.PASS, kernel_ms=1.0, reference_ms=0.69)
    record(soft_small, cuda, current, Status.UNSUPPORTED)
    record(gemm_big, cuda, current, Status.COMPILE_ERROR)
    record(soft_big, cuda, current, Status.LOWERED)
    for source, s, tokens, calls in [
        ("alpha", gemm_1, 1, 10),
        ("alpha", norm_1, 1, 30),
        ("alpha", soft_small, 1, 10),
        ("alpha", gemm_big, 4096, 20),
        ("alpha", norm_big, 4096, 30),
        ("beta", gemm_1, 1, 40),
        ("beta", soft_big, 512, 60),
    ]:
        ServedCall.objects.create(source=source, shape=s, tokens=tokens, calls=calls)
    return {
        "gemm_1": gemm_1,
        "gemm_big": gemm_big,
        "norm_1": norm_1,
        "norm_big": norm_big,
        "soft_small": soft_small,
        "soft_big": soft_big,
    }


def coverage(response, model: str, backend: str):
    found = next(m for m in response.context["models"] if m.name == model)
    return next(d for d in found.devices if d.device_type.backend == backend)


def test_each_model_counts_its_own_calls_by_what_production_runs(client, served):
    response = client.get(reverse("models"))
    assert response.status_code == 200
    alpha = coverage(response, "alpha", "cuda")
    assert alpha.shares.calls == {"tilelang": 10, "reference": 60, "unvalidated": 30}
    # The shape both models call counts for each with its own count.
    beta = coverage(response, "beta", "cuda")
    assert beta.shares.calls == {"tilelang": 40, "reference": 0, "unvalidated": 60}
    body = response.content.decode()
    assert "10% TileLang" in body and "40% TileLang" in body


def test_each_step_size_has_its_own_shares(client, served):
    alpha = coverage(client.get(reverse("models")), "alpha", "cuda")
    steps = {tokens: shares.percents for tokens, shares in alpha.steps}
    assert steps == {
        1: {"tilelang": 20.0, "reference": 80.0, "unvalidated": 0.0},
        4096: {"tilelang": 0.0, "reference": 40.0, "unvalidated": 60.0},
    }


def test_the_missing_pieces_rank_by_calls_and_say_why(client, served):
    response = client.get(reverse("models"), {"model": "alpha"})
    alpha = coverage(response, "alpha", "cuda")
    assert [(p.shape, p.calls, p.verdict.reason) for p in alpha.pieces] == [
        (served["norm_1"], 30, "pass, but 0.69× of the reference"),
        (served["norm_big"], 30, "never run"),
        (served["gemm_big"], 20, "compile error"),
        (served["soft_small"], 10, "unsupported by the kernel"),
    ]
    # A fresh run closes the never-run and failing ones, not the others.
    assert [p.shape for p in alpha.rerunnable] == [
        served["norm_big"],
        served["gemm_big"],
    ]
    body = response.content.decode()
    # Each piece links to its cell.
    cuda = alpha.device_type
    assert f'href="/cells/{served["norm_1"].pk}/{cuda.pk}/?toolchain=tl-0.1.15"' in body
    assert "Run missing for these 2 cells" in body


def test_the_summary_counts_each_models_missing_pieces_and_lists_none(
    client, served, device_types
):
    """Two models, none chosen: each device's cell counts its missing pieces
    and links to them; no piece is listed until a model is chosen."""
    response = client.get(reverse("models"), {"backend": "cuda"})
    assert response.context["detailed"] == []
    body = response.content.decode()
    cuda = device_types["cuda"].pk
    for model, missing in (("alpha", 4), ("beta", 1)):
        row = body.split(f"model={model}", 1)[1].split("</tr>")[0]
        assert f'#dt-{cuda}">{missing} missing piece{"s" * (missing > 1)}</a>' in row
    assert 'class="list pieces"' not in body


def test_a_chosen_model_lists_its_biggest_pieces_and_links_to_all(
    client, served, monkeypatch
):
    from matrix.views import models

    monkeypatch.setattr(models, "PIECES_SHOWN", 3)
    response = client.get(reverse("models"), {"model": "alpha", "backend": "cuda"})
    alpha = coverage(response, "alpha", "cuda")
    assert alpha.shown == alpha.pieces[:3] and alpha.missing == 4
    body = response.content.decode()
    assert "4 cells not serving TileLang, the most calls first" in body
    assert "Showing the 3 with the most calls of 4:" in body
    every = client.get(
        reverse("models"), {"model": "alpha", "backend": "cuda", "pieces": "all"}
    )
    assert len(coverage(every, "alpha", "cuda").shown) == 4
    assert "Showing the" not in every.content.decode()


def test_run_missing_opens_the_gaps_of_exactly_that_model_and_device(
    client, served, device_types
):
    alpha = coverage(client.get(reverse("models"), {"model": "alpha"}), "alpha", "cuda")
    link = f"{reverse('gaps')}?{alpha.gaps_query}"
    assert f"model=alpha&device={device_types['cuda'].pk}" in link
    gaps = client.get(link).context["gaps"]
    listed = {(g.shape_id, g.device_type.pk) for g in gaps}
    alpha_cells = {
        (s.pk, device_types["cuda"].pk)
        for s in Shape.objects.filter(served_calls__source="alpha")
    }
    assert listed <= alpha_cells
    assert {(p.shape.pk, device_types["cuda"].pk) for p in alpha.rerunnable} <= listed


def test_filters_narrow_the_calls_counted(client, served):
    response = client.get(reverse("models"), {"operator": "rmsnorm", "device": ""})
    alpha = coverage(response, "alpha", "cuda")
    assert alpha.shares.calls == {"tilelang": 0, "reference": 30, "unvalidated": 30}
    # beta calls no rmsnorm: it has nothing under this filter.
    assert [m.name for m in response.context["models"]] == ["alpha"]
    by_shape = client.get(reverse("models"), {"q": "M=1,"})
    beta = coverage(by_shape, "beta", "cuda")
    assert beta.shares.calls == {"tilelang": 40, "reference": 0, "unvalidated": 0}


def test_an_unknown_model_is_named(client, served):
    body = client.get(reverse("models"), {"model": "gpt-9"}).content.decode()
    assert "Unknown model “gpt-9”: showing every model instead." in body


def test_no_model_imported_says_how_to_import_one(client, results):
    body = client.get(reverse("models")).content.decode()
    assert "No served model is imported yet" in body
    assert "import_shapes --profile llama-3-8b" in body


def test_the_page_stays_within_a_fixed_number_of_queries(
    client, served, viewer, django_assert_num_queries
):
    client.force_login(viewer)
    client.get(reverse("models"))  # the filter choices, cached for a few seconds

    def count():
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("models"), {"model": "alpha"}).status_code == 200
        return len(queries)

    few = count()
    # Ten more models over every shape: the page reads no more.
    for i in range(10):
        for s in Shape.objects.filter(served=True):
            ServedCall.objects.create(source=f"model-{i}", shape=s, tokens=1, calls=i)
    assert count() == few
    # The page computed (the import changed the catalogue's stamp), not
    # served from its cache: the stamp, and the calls and their shapes read
    # apart (a shape once, not once a call).
    assert few <= 11


def test_the_csv_export_has_a_row_per_model_device_and_step(client, served):
    response = client.get(reverse("models-csv"), {"backend": "cuda"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    whole = next(r for r in rows if r["model"] == "alpha" and r["tokens"] == "all")
    assert (
        whole["tilelang_percent"],
        whole["reference_percent"],
        whole["unvalidated_percent"],
    ) == ("10.0", "60.0", "30.0")
    assert {(r["model"], r["tokens"]) for r in rows} == {
        ("alpha", "all"),
        ("alpha", "1"),
        ("alpha", "4096"),
        ("beta", "all"),
        ("beta", "1"),
        ("beta", "512"),
    }


def test_a_model_name_cannot_become_a_spreadsheet_formula(client, served):
    ServedCall.objects.create(
        source="=HYPERLINK(1)", shape=served["gemm_1"], tokens=1, calls=1
    )
    body = client.get(reverse("models-csv")).content.decode()
    assert "'=HYPERLINK(1)" in body


def test_the_page_has_export_links(client, served):
    body = client.get(reverse("models"), {"backend": "cuda"}).content.decode()
    assert 'href="/models.csv?toolchain=tl-0.1.15&amp;backend=cuda"' in body
    assert 'href="/api/v1/models?toolchain=tl-0.1.15&amp;backend=cuda"' in body


def test_it_refuses_post(client, viewer):
    client.force_login(viewer)
    assert client.post(reverse("models")).status_code == 405


# --- the API ---------------------------------------------------------------


@pytest.fixture
def reader(client, viewer, settings):
    settings.TILEMATRIX_ANONYMOUS_READ = False
    client.force_login(viewer)
    return client


def test_the_api_says_what_the_page_says(reader, served, device_types):
    body = reader.get("/api/v1/models", {"backend": "cuda", "pieces": 3}).json()
    assert body["speedup_floor"] == 0.95
    alpha = next(m for m in body["models"] if m["name"] == "alpha")
    assert alpha["calls_per_step"] == 100 and alpha["tokens"] == [1, 4096]
    (cuda,) = alpha["devices"]
    assert cuda["calls"] == {"tilelang": 10, "reference": 60, "unvalidated": 30}
    assert cuda["percent"] == {"tilelang": 10, "reference": 60, "unvalidated": 30}
    assert cuda["missing"] == 4 and len(cuda["pieces"]) == 3
    first = cuda["pieces"][0]
    assert (first["operator"], first["status"], first["serves"]) == (
        "rmsnorm",
        "pass",
        "reference",
    )
    assert first["speedup"] == pytest.approx(0.69)
    assert cuda["run_missing_url"].startswith("/gaps/?toolchain=tl-0.1.15")
    assert f"device={device_types['cuda'].pk}" in cuda["run_missing_url"]


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"model": "gpt-9"}, 404, "no served model named 'gpt-9'; known: alpha, beta"),
        ({"device": 999999}, 404, "no device type with id 999999"),
        ({"pieces": 5000}, 422, "less than or equal to 1000"),
        ({"status": "green"}, 400, "status must be one of"),
    ],
)
def test_the_api_refuses_unknown_filters(reader, served, params, status, says):
    response = reader.get("/api/v1/models", params)
    assert response.status_code == status
    assert says in response.content.decode()


def test_the_api_is_in_the_schema(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/models" in schema["paths"]
    assert "ModelsOut" in schema["components"]["schemas"]


def test_device_and_toolchain_names_cannot_become_formulas_either(client, served):
    DeviceType.objects.update(vendor="@SUM(1)")
    Toolchain.objects.filter(is_current=True).update(name="+cmd")
    body = client.get(reverse("models-csv"), {"toolchain": "+cmd"}).content.decode()
    lines = body.splitlines()[1:]
    assert lines and all(not line.startswith(("=", "+", "-", "@")) for line in lines)
    assert "'@SUM(1)" in body and "'+cmd" in body


def test_a_step_with_one_failing_call_in_a_thousand_is_never_100_percent(
    client, served
):
    # gemm M=1 passes at TileLang's speed; one call in 1,000 does not compile.
    ServedCall.objects.create(
        source="gamma", shape=served["gemm_1"], tokens=1, calls=999
    )
    ServedCall.objects.create(
        source="gamma", shape=served["gemm_big"], tokens=1, calls=1
    )
    # A second step size, so the page lists the steps.
    ServedCall.objects.create(source="gamma", shape=served["gemm_1"], tokens=8, calls=1)
    response = client.get(reverse("models"), {"model": "gamma", "backend": "cuda"})
    body = response.content.decode()
    assert "&gt;99% TileLang" in body and "100% TileLang" not in body
    row = re.search(r'<th scope="row">1</th>(.*?)</tr>', body).group(1)
    assert '<td class="pct o-tilelang">&gt;99%</td>' in row
    assert '<td class="pct o-reference">&lt;1%</td>' in row
    assert '<td class="pct o-unvalidated none">0%</td>' in row


def test_no_tilelang_at_all_is_not_shown_as_a_success(client, served):
    response = client.get(reverse("models"), {"backend": "hip"})
    body = response.content.decode()
    assert '<span class="none">0% TileLang</span>' in body
    assert '<strong class="o-tilelang">0% TileLang' not in body


def test_a_cell_failing_here_that_passes_on_a_proposed_toolchain_says_so(
    client, served, toolchains, device_types, django_user_model
):
    # gemm M=4096 does not compile on tl-0.1.15; it passes on tl-0.1.13, on
    # the same kernel revision, and an upgrade proposes going there.
    from matrix.gate.services import proposal_open

    old, current = toolchains
    cuda = device_types["cuda"]
    record(served["gemm_big"], cuda, old, Status.PASS, kernel_ms=1.0, reference_ms=1.0)
    proposer = django_user_model.objects.create_superuser("prop", password="x")
    proposal = proposal_open(
        baseline=current, candidate=old, device_types=[cuda], by=proposer
    )
    response = client.get(reverse("models"), {"model": "alpha"})
    alpha = coverage(response, "alpha", "cuda")
    piece = next(p for p in alpha.pieces if p.shape == served["gemm_big"])
    assert piece.passes_on == ("tl-0.1.13", proposal.pk, False)
    # A run here would fail the same way: it is no longer offered as one.
    assert [p.shape for p in alpha.rerunnable] == [served["norm_big"]]
    body = response.content.decode()
    assert (
        f'fixed on candidate tl-0.1.13 (<a href="/upgrades/{proposal.pk}/">upgrade '
        f"#{proposal.pk}</a>): a run here fails the same way"
    ) in body
    assert "Run missing for this cell" in body


def test_an_older_revision_failing_here_and_passing_on_the_candidate_is_fixed_there(
    client, served, toolchains, device_types, django_user_model
):
    """As the demo's H200 softmax: one kernel revision fails to compile on
    the current toolchain and passes on the candidate, and the current
    revision is another one, never run here. The page says the candidate
    fixes the revision that failed, and still offers a run of the current
    one, which may fail or pass."""
    from matrix.gate.services import proposal_open

    old, current = toolchains
    cuda = device_types["cuda"]
    norm = served["norm_big"]
    earlier = KernelRevision.objects.create(
        operator=norm.operator,
        source_sha256=hashlib.sha256(b"rmsnorm, an earlier revision").hexdigest(),
        origin=KernelRevision.Origin.LIBRARY,
        review_state=KernelRevision.Review.APPROVED,
    )
    record(norm, cuda, current, Status.COMPILE_ERROR, revision=earlier)
    record(norm, cuda, old, Status.PASS, revision=earlier, kernel_ms=1, reference_ms=1)
    # The current revision passing there says nothing of the one failing
    # here: gemm M=4096 fails on the current revision, and only an earlier
    # one passes on tl-0.1.13.
    gemm_earlier = KernelRevision.objects.create(
        operator=served["gemm_big"].operator,
        source_sha256=hashlib.sha256(b"gemm, an earlier revision").hexdigest(),
        origin=KernelRevision.Origin.LIBRARY,
        review_state=KernelRevision.Review.APPROVED,
    )
    record(served["gemm_big"], cuda, old, Status.PASS, revision=gemm_earlier)
    proposer = django_user_model.objects.create_superuser("prop", password="x")
    proposal = proposal_open(
        baseline=current, candidate=old, device_types=[cuda], by=proposer
    )

    response = client.get(reverse("models"), {"model": "alpha"})

    alpha = coverage(response, "alpha", "cuda")
    pieces = {p.shape: p for p in alpha.pieces}
    assert pieces[norm].passes_on == ("tl-0.1.13", proposal.pk, True)
    assert pieces[served["gemm_big"]].passes_on is None
    # Both stay offered to Run missing: each runs the current revision.
    assert {p.shape for p in alpha.rerunnable} == {norm, served["gemm_big"]}
    body = response.content.decode()
    assert (
        f'fixed on candidate tl-0.1.13 (<a href="/upgrades/{proposal.pk}/">upgrade '
        f"#{proposal.pk}</a>): the revision that failed here passes there; a run "
        "tries the current one"
    ) in body
    api = client.get("/api/v1/models", {"model": "alpha"}).json()
    (cuda_row,) = [
        d for d in api["models"][0]["devices"] if d["device_type_id"] == cuda.pk
    ]
    by_dims = {(p["operator"], p["dims"]["M"]): p for p in cuda_row["pieces"]}
    assert by_dims["rmsnorm", 4096]["passes_on"] == "tl-0.1.13"
    assert by_dims["rmsnorm", 4096]["rerun_helps"] is True
    assert by_dims["gemm", 4096]["passes_on"] is None
