"""Template context shared by every page."""

from __future__ import annotations

import hashlib
from functools import cached_property

from django.core.cache import cache

from matrix import read_versions
from matrix.accounts.roles import ADMIN, has_role

ADMIN_LINK_SECONDS = 60


def admin_link_of(user) -> bool:
    """Whether the navigation offers ``user`` the admin site.

    The site admits holders of the admin role only (``RoleAdminSite``), so
    the link follows the role rather than the ``perms`` proxy, which loaded
    every permission of the user and of their groups on every page. The
    answer is kept per user for a minute: the link is a convenience, and the
    admin site checks the role on every request itself."""
    if not user.is_authenticated:
        return False
    return cache.get_or_set(
        f"admin-link:{user.pk}", lambda: has_role(user, ADMIN), ADMIN_LINK_SECONDS
    )


def roles(request) -> dict:
    """``admin_link``, read only by a page that shows the navigation."""
    return {"admin_link": lambda: admin_link_of(request.user)}


# The filter forms' choices change with the catalogue only: read at most
# once per this many seconds for every page and visitor.
CHOICES_SECONDS = 5


def _choices_read() -> dict:
    """Operators and served models (one query), device types in the
    matrix's order (one), and the hosts of each toolchain (one)."""
    from django.db.models import CharField, Value

    from matrix.models import DeviceType, Operator, ServedCall
    from matrix.queries import MatrixFilters, device_type_list, toolchain_hosts

    names = Operator.objects.annotate(
        kind=Value("operator", output_field=CharField())
    ).values_list("kind", "name")
    sources = ServedCall.objects.annotate(
        kind=Value("model", output_field=CharField())
    ).values_list("kind", "source")
    rows = sorted(names.order_by().union(sources.order_by()))
    choices = {
        "operators": [name for kind, name in rows if kind == "operator"],
        "models": [name for kind, name in rows if kind == "model"],
        "device_types": device_type_list(
            MatrixFilters(None), list(DeviceType.objects.all())
        ),
        "toolchain_hosts": toolchain_hosts(),
    }
    # What a kept page's filter form showed (matrix.page_cache).
    shown = [
        choices["operators"],
        choices["models"],
        [(d.pk, str(d)) for d in choices["device_types"]],
        sorted(choices["toolchain_hosts"].items()),
    ]
    choices["digest"] = hashlib.sha256(repr(shown).encode()).hexdigest()[:16]
    return choices


class FilterChoices:
    """The values the filter forms offer, read on first use only: a page
    whose form is cached, or that has none, asks for nothing."""

    @cached_property
    def _data(self) -> dict:
        return cache.get_or_set("filter-choices", _choices_read, CHOICES_SECONDS)

    @property
    def stale_bound_s(self) -> int | None:
        """How far behind ingest a coverage page may be (None: not at all,
        the cache is one per process; matrix.read_versions)."""
        return read_versions.STALE_BOUND_S if read_versions.shared() else None

    @property
    def operators(self) -> list[str]:
        return self._data["operators"]

    @property
    def models(self) -> list[str]:
        return self._data["models"]

    @property
    def device_types(self):
        return self._data["device_types"]

    @property
    def toolchain_hosts(self) -> dict[int, list[str]]:
        return self._data["toolchain_hosts"]

    @property
    def digest(self) -> str:
        """Changes whenever any of the values offered does. Kept apart from
        the values too: a page served from the cache needs only this, and
        reading the values (model instances) was 5% of such a view."""
        if "_data" in self.__dict__:
            return self._data["digest"]
        found = cache.get("filter-choices-digest")
        if found is None:
            found = self._data["digest"]
            cache.set("filter-choices-digest", found, CHOICES_SECONDS)
        return found


def filter_choices(request) -> dict:
    return {"filter_choices": FilterChoices()}
