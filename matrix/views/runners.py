"""Runner hosts: state, health, heartbeat, devices, toolchains, queue depth;
registration tokens, approval of what a new runner claims, revocation and
maintenance."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from matrix.fleet import services
from matrix.fleet.models import Runner
from matrix.models import JobState, ValidationJob

TOKEN_LIFETIME = timedelta(hours=1)
# Longer than the gap between a double click's two requests on a loaded host,
# shorter than reading one command and clicking again for the next runner.
DOUBLE_CLICK_WINDOW = timedelta(seconds=2)


def can_manage_runners(user) -> bool:
    # The runner admin role holds both permissions.
    return user.is_authenticated and user.has_perm("runners.change_runner")


def can_register_runners(user) -> bool:
    return user.is_authenticated and user.has_perm("runners.add_registrationtoken")


def runner_rows(runners: list[Runner]) -> list[dict]:
    """Each runner with its queue depth: jobs waiting on a queue it consumes
    plus jobs it is running. One query for all runners."""
    queued: dict[str, int] = defaultdict(int)
    running: dict[int, int] = defaultdict(int)
    for queue, state, runner_id, n in (
        ValidationJob.objects.open()
        .values_list("queue", "state", "runner_id")
        .annotate(n=Count("id"))
        .order_by()
    ):
        if state == JobState.QUEUED:
            queued[queue] += n
        elif runner_id is not None:
            running[runner_id] += n
    cutoff = services.silent_cutoff()
    cpu_hosts = _cpu_hosts()
    return [
        {
            "runner": r,
            "queued": sum(queued.get(q, 0) for q in r.queues()),
            "running": running.get(r.pk, 0),
            # Still marked online, but its heartbeats stopped: the reaper
            # (on the control worker) has not run since, or that is down too.
            "silent": r.state != Runner.State.OFFLINE
            and (r.last_heartbeat is None or r.last_heartbeat < cutoff),
            # Two runners timing kernels on one host's CPU slow each other
            # down (docs/deploy.md): said where it happens.
            "shares_cpu_with": [
                name for name in cpu_hosts.get(_host(r), []) if name != r.name
            ]
            if r.revoked_at is None and _host(r) in cpu_hosts
            else [],
        }
        for r in runners
    ]


def _host(runner: Runner) -> str:
    return ((runner.inventory or {}).get("host") or {}).get("hostname", "")


def _cpu_hosts() -> dict[str, list[str]]:
    """host name -> the unrevoked runners on it that time CPU kernels."""
    hosts: dict[str, list[str]] = defaultdict(list)
    for runner in Runner.objects.filter(revoked_at__isnull=True).only(
        "name", "inventory"
    ):
        devices = (runner.inventory or {}).get("devices", [])
        if _host(runner) and any(d.get("backend") == "c" for d in devices):
            hosts[_host(runner)].append(runner.name)
    return {h: sorted(names) for h, names in hosts.items() if len(names) > 1}


def _runners():
    return list(
        Runner.objects.prefetch_related("device_types", "toolchains").order_by("name")
    )


@require_GET
@vary_on_headers("HX-Request")
def runners_page(request):
    context = {
        "rows": runner_rows(_runners()),
        "can_manage": can_manage_runners(request.user),
        "can_register": can_register_runners(request.user),
    }
    template = "matrix/runners.html"
    if request.htmx and request.htmx.target == "runner-list":
        template += "#runner-list"
    return render(request, template, context)


@login_required
@require_POST
@sensitive_post_parameters()
@sensitive_variables("token", "context")
def runner_token_create(request):
    """A registration token, shown once with the command to run on the host."""
    if not can_register_runners(request.user):
        raise PermissionDenied(
            "registering runners needs runners.add_registrationtoken"
        )
    token = services.token_create_unless_just_made(
        expires=TOKEN_LIFETIME, created_by=request.user, within=DOUBLE_CLICK_WINDOW
    )
    if token is None:
        # The first request's token is already on the page: leave it there.
        if request.htmx:
            return HttpResponse(status=204)
        return render(
            request,
            "matrix/runners.html#token-just-made",
            {"window_s": int(DOUBLE_CLICK_WINDOW.total_seconds())},
            status=409,
        )
    context = {
        "token": token,
        "server": request.build_absolute_uri("/").rstrip("/"),
        "lifetime_min": int(TOKEN_LIFETIME.total_seconds() // 60),
    }
    response = render(request, "matrix/runners.html#token-once", context)
    # The token must not linger in any cache.
    response["Cache-Control"] = "no-store"
    return response


def _get_runner_for_user(request, pk: int) -> Runner:
    if not can_manage_runners(request.user):
        raise PermissionDenied("managing runners needs runners.change_runner")
    return get_object_or_404(Runner, pk=pk)


def _after_change(request, runner: Runner, *, revoked: bool = False):
    if not request.htmx:
        return redirect("runners")
    runner = Runner.objects.prefetch_related("device_types", "toolchains").get(
        pk=runner.pk
    )
    context = {
        "row": runner_rows([runner])[0],
        "can_manage": True,
        "focus_revoked": revoked,
    }
    return render(request, "matrix/runners.html#runner-row", context)


@login_required
@require_POST
def runner_health(request, pk: int):
    """Maintenance on or off: a runner in maintenance is given no work."""
    runner = _get_runner_for_user(request, pk)
    health = request.POST.get("health")
    if health not in (Runner.Health.ACTIVE, Runner.Health.MAINTENANCE):
        return HttpResponseBadRequest("health must be active or maintenance")
    try:
        services.runner_health_set(runner=runner, health=health, by=request.user)
    except ValidationError as exc:
        return HttpResponseBadRequest("; ".join(exc.messages))
    return _after_change(request, runner)


@login_required
@require_POST
def runner_approve(request, pk: int):
    """A pending runner's inventory, as shown in its row, is approved: it
    gets its queues."""
    return _decide(request, pk, services.runner_approve)


@login_required
@require_POST
def runner_refuse(request, pk: int):
    """A pending runner is refused: its key is revoked."""
    return _decide(request, pk, services.runner_refuse)


def _decide(request, pk: int, decide):
    runner = _get_runner_for_user(request, pk)
    try:
        runner = decide(name=runner.name, by=request.user)
    except ValidationError as exc:
        return HttpResponseBadRequest("; ".join(exc.messages))
    return _after_change(request, runner, revoked=runner.revoked_at is not None)


@login_required
@require_POST
def runner_revoke(request, pk: int):
    runner = _get_runner_for_user(request, pk)
    runner = services.runner_revoke(name=runner.name, by=request.user)
    return _after_change(request, runner, revoked=True)
