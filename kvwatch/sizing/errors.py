"""The one error every sizing module raises: figures that cannot be used (a leaf, so the
arithmetic modules can share it without importing each other)."""

from __future__ import annotations

__all__ = ["SizingError"]


class SizingError(ValueError):
    """Figures that cannot be used; the message says which and why."""
