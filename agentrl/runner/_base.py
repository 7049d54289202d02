"""The base of every run-config section: a frozen pydantic model that refuses unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    """Frozen after validation; an unknown key is an error that names it (``extra="forbid"``).

    Mapping fields (``options``, ``fields``...) are plain dicts: the section cannot be re-assigned,
    but do not mutate them in place (the run's hash is computed from their contents).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
