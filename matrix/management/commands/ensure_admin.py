from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create the admin account once: DJANGO_SUPERUSER_USERNAME / "
        "DJANGO_SUPERUSER_PASSWORD if set, else 'admin' with a generated "
        "password printed this one time."
    )

    def handle(self, *args, **options):
        User = get_user_model()
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"admin account {username!r} exists")
            return
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        generated = not password
        password = password or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                self.style.WARNING(
                    f"admin account: {username} / {password}  (shown once)"
                )
            )
        else:
            self.stdout.write(f"admin account {username!r} created")
