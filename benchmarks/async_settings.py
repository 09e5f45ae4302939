"""``benchmarks.settings`` plus the async job types of ``benchmarks.async_throughput``.

Imported as the settings of the driver and of its consumer: the job types register as the
settings load (a job type module needs no app registry), in every process that runs them.
"""

from __future__ import annotations

import benchmarks.async_jobs  # noqa: F401
from benchmarks.settings import *  # noqa: F403
