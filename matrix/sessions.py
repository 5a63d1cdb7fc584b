"""Sessions read from the shared cache, kept usable while that cache is down."""

from __future__ import annotations

import logging

from django.contrib.sessions.backends import cached_db

logger = logging.getLogger("django.contrib.sessions")


class SessionStore(cached_db.SessionStore):
    """Django's ``cached_db`` store, except that while the cache is
    unreachable a session is read, and a new session key checked, in the
    database instead of failing the request (the stock store fails when it
    cannot put the row it read back into the cache). Saving already
    tolerates a cache error; deleting (a logout) still fails loudly, so a
    session the cache could not forget is never reported as ended."""

    def exists(self, session_key):
        try:
            if session_key and self.cache_key_prefix + session_key in self._cache:
                return True
        except Exception:
            pass
        return super(cached_db.SessionStore, self).exists(session_key)

    def load(self):
        try:
            data = self._cache.get(self.cache_key)
        except Exception:
            data = None
        if data is not None:
            return data
        row = self._get_session_from_db()
        if not row:
            return {}
        data = self.decode(row.session_data)
        try:
            self._cache.set(
                self.cache_key, data, self.get_expiry_age(expiry=row.expire_date)
            )
        except Exception:
            logger.warning("session read from the database: cache unreachable")
        return data
