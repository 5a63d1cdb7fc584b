"""Bisection across toolchains: which TileLang release changed a cell."""
