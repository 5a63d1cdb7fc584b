"""Template context shared by every page."""

from __future__ import annotations

from django.core.cache import cache

from runners.roles import ADMIN, has_role

ADMIN_LINK_SECONDS = 60


def roles(request) -> dict:
    """``admin_link``: whether the navigation offers the admin site.

    The site admits holders of the admin role only (``RoleAdminSite``), so
    the link follows the role rather than the ``perms`` proxy, which loaded
    every permission of the user and of their groups on every page. The
    answer is kept per user for a minute: the link is a convenience, and the
    admin site checks the role on every request itself."""

    def admin_link() -> bool:
        user = request.user
        if not user.is_authenticated:
            return False
        return cache.get_or_set(
            f"admin-link:{user.pk}",
            lambda: has_role(user, ADMIN),
            ADMIN_LINK_SECONDS,
        )

    return {"admin_link": admin_link}
