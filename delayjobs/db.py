"""Compatibility path: the code lives in delayjobs.core.db."""

from delayjobs.core.db import (
    attname,
    column,
    concrete_field,
    drop_broken_connections,
    fetch_models,
    is_psycopg3,
    max_length,
    supports_update_returning,
    update_returning,
    verbose_name,
)

__all__ = [
    "attname",
    "column",
    "concrete_field",
    "drop_broken_connections",
    "fetch_models",
    "is_psycopg3",
    "max_length",
    "supports_update_returning",
    "update_returning",
    "verbose_name",
]
