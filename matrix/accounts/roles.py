"""Roles: five groups and what each may do, deny by default.

A role is a Django group holding permissions; views check permissions (or,
for reviews, membership of the reviewer group) and ``RoleMiddleware`` lets no
one past who holds nothing at all: an account with no role and no permission
granted to it directly reads nothing, whatever a view forgets. The groups are created (and their permissions set)
after every migrate, so a fresh database has them.

    viewer        reads the matrix, gaps, errors, runners, upgrades, submissions
    kernel author submits kernel revisions
    reviewer      approves or rejects submissions (never their own), proposes
                  and decides upgrades (never their own), runs sweeps and
                  bisections
    runner admin  creates registration tokens, sets maintenance, revokes runners,
                  runs sweeps and bisections
    admin         everything, the admin site included

Anonymous reading is the embedded default's convenience (``make run`` opens
on a populated matrix): ``TILEMATRIX_ANONYMOUS_READ``, off unless DEBUG.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.admin import AdminSite, ModelAdmin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import Resolver404, resolve

VIEWER = "viewer"
KERNEL_AUTHOR = "kernel author"
REVIEWER = "reviewer"
RUNNER_ADMIN = "runner admin"
ADMIN = "admin"
ROLES = (VIEWER, KERNEL_AUTHOR, REVIEWER, RUNNER_ADMIN, ADMIN)

# "app_label.codename" per role; admin gets every permission of these apps.
ROLE_PERMISSIONS = {
    VIEWER: (),
    KERNEL_AUTHOR: ("matrix.add_kernelrevision",),
    REVIEWER: (
        "matrix.change_kernelrevision",
        "matrix.add_sweep",
        "matrix.add_bisection",
        "matrix.propose_upgrade",
    ),
    RUNNER_ADMIN: (
        "runners.add_registrationtoken",
        "runners.change_runner",
        "matrix.add_sweep",
        "matrix.add_bisection",
    ),
}
ADMIN_APPS = ("matrix", "runners", "auth", "axes")

# Reachable without a role: signing in and out, the API (which authenticates
# each route itself: signed runner messages, tokens) and static files.
PUBLIC_URL_NAMES = {"login", "logout", "favicon"}
PUBLIC_NAMESPACES = {"api"}
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def roles_create(app_config=None, **kwargs) -> None:
    """Create the role groups and set their permissions; idempotent (a
    post_migrate receiver). post_migrate comes once per app, in
    INSTALLED_APPS order, after every migrate and every test database flush:
    the roles are set once, after the last app's permissions exist (each
    app's turn repeated it, about 200 statements a flush)."""
    from django.apps import apps
    from django.contrib.auth.models import Group, Permission

    migrated = [c for c in apps.get_app_configs() if c.models_module is not None]
    if app_config is not None and app_config is not migrated[-1]:
        return

    for role in ROLES:
        group, _ = Group.objects.get_or_create(name=role)
        if role == ADMIN:
            permissions = Permission.objects.filter(
                content_type__app_label__in=ADMIN_APPS
            )
        else:
            wanted = [name.split(".") for name in ROLE_PERMISSIONS[role]]
            permissions = [
                p
                for p in Permission.objects.filter(
                    codename__in=[codename for _, codename in wanted]
                ).select_related("content_type")
                if [p.content_type.app_label, p.codename] in wanted
            ]
        group.permissions.set(permissions)


def roles_of(user) -> set[str]:
    if not user.is_authenticated:
        return set()
    cached = getattr(user, "_tilematrix_roles", None)
    if cached is None:
        cached = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        if user.is_superuser:
            cached.add(ADMIN)
        user._tilematrix_roles = cached
    return cached


def has_role(user, *roles: str) -> bool:
    """True if ``user`` holds one of ``roles``; admin holds every role.
    With no role named: any role, or any permission an admin granted the
    account directly (a grant is a role of one)."""
    if not roles:
        return _has_any_grant(user)
    held = roles_of(user)
    return ADMIN in held or bool(held & set(roles))


def _has_any_grant(user) -> bool:
    """One EXISTS query per request, however many groups the user has."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    cached = getattr(user, "_tilematrix_granted", None)
    if cached is None:
        from django.contrib.auth import get_user_model

        cached = get_user_model().objects.filter(pk=user.pk).filter(granted()).exists()
        user._tilematrix_granted = cached
    return cached


def granted():
    """The accounts that hold a role or a permission granted directly."""
    from django.db.models import Q

    return Q(groups__name__in=ROLES) | Q(user_permissions__isnull=False)


def is_reviewer(user) -> bool:
    return has_role(user, REVIEWER)


class RoleMiddleware:
    """Deny by default: every page but the public ones needs a signed-in
    user with a role. Views still check the permission of each action."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return self.get_response(request)
        if match.url_name in PUBLIC_URL_NAMES or PUBLIC_NAMESPACES & set(
            match.namespaces
        ):
            return self.get_response(request)
        if "admin" in match.namespaces:
            # The admin site applies the same rule itself (RoleAdminSite).
            return self.get_response(request)
        if (
            getattr(settings, "TILEMATRIX_ANONYMOUS_READ", False)
            and request.method in SAFE_METHODS
        ):
            return self.get_response(request)
        user = request.user
        if has_role(user):
            return self.get_response(request)
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        raise PermissionDenied("your account has no role; ask an admin for one")


class AuditedAdmin:
    """Mixed into every ModelAdmin of the admin site (RoleAdminSite.register):
    each add, change and delete made there is also an AuditEvent, in the
    same transaction, whoever registered the model (auth's users and groups,
    axes' lockouts included). Django's own LogEntry is not the audit log."""

    def log_addition(self, request, obj, message):
        self._audit(request, obj, "add", message)
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        self._audit(request, obj, "change", message)
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        for obj in queryset:
            self._audit(request, obj, "delete", [])
        return super().log_deletions(request, queryset)

    def _audit(self, request, obj, action: str, message) -> None:
        from matrix.models import AuditEvent

        AuditEvent.record(
            actor=request.user,
            verb=f"admin.{action}",
            obj=obj,
            # Which fields changed (Django's change message), never values:
            # a password form is a change too.
            after={"object": str(obj)[:200], "change": message or []},
        )


class RoleAdminSite(AdminSite):
    """The admin site for holders of the admin role only (staff status alone
    is not enough), where every change made is audited."""

    def has_permission(self, request):
        return request.user.is_active and has_role(request.user, ADMIN)

    def register(self, model_or_iterable, admin_class=None, **options):
        admin_class = admin_class or ModelAdmin
        if not issubclass(admin_class, AuditedAdmin):
            admin_class = type(
                admin_class.__name__,
                (AuditedAdmin, admin_class),
                {"__module__": admin_class.__module__},
            )
        super().register(model_or_iterable, admin_class, **options)
