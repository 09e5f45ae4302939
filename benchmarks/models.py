"""The table the ``orm`` benchmark body updates (``benchmarks.bodies``)."""

from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """One of ``bodies.COUNTER_ROWS`` counters, seeded by the driver before consumers start."""

    id = models.IntegerField(primary_key=True)
    n = models.BigIntegerField(default=0)

    class Meta:
        db_table = "bench_counter"

    def __str__(self) -> str:
        return f"counter {self.id}: {self.n}"
