from __future__ import annotations

from django.contrib.admin import apps as admin_apps


class RoleAdminConfig(admin_apps.AdminConfig):
    """The admin site behind the admin role (``matrix.accounts.roles``)."""

    default = False
    default_site = "matrix.accounts.roles.RoleAdminSite"

    def ready(self):
        from django.db.models.signals import post_migrate

        from matrix.accounts.roles import roles_create

        super().ready()
        # After every app's migrations, not only this one's: the admin role
        # holds the permissions of apps migrated after it (axes).
        post_migrate.connect(roles_create, dispatch_uid="roles_create")
