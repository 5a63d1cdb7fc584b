"""Pages, one module each: matrix, gaps (and sweeps), cells, errors, runners."""

from __future__ import annotations
