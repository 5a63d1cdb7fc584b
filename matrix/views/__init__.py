from __future__ import annotations

from matrix.views.matrix import matrix_page

__all__ = ["matrix_page"]
