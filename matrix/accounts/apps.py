from __future__ import annotations

from django.contrib.admin import apps as admin_apps


class RoleAdminConfig(admin_apps.AdminConfig):
    """The admin site behind the admin role (``matrix.accounts.roles``)."""

    default = False
    default_site = "matrix.accounts.roles.RoleAdminSite"
