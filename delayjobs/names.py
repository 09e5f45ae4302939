"""What a job type's name and a queue's name may be: the one definition of both rules.

Job types (``JobType.name``, ``.queue``), the job spec (``schedule(queue=...)``), the
settings (``QUEUE_CONCURRENCY``'s keys), the Tasks backend (``QUEUES``), the commands
(``--queue``) and the columns that store them share these. A queue name never contains
``|``, which separates queue and job type in a lane's name (``delayjobs.lanes``).

Imports nothing: the settings (``delayjobs.conf``) and the models build on it.
"""

from __future__ import annotations

import re
from typing import Any

#: The longest job type name and queue name (their columns' max_length).
NAME_MAX_LENGTH = 200
QUEUE_MAX_LENGTH = 100
NAME_PATTERN = re.compile(rf"^[A-Za-z0-9_.:-]{{1,{NAME_MAX_LENGTH}}}$")
QUEUE_PATTERN = re.compile(rf"^[A-Za-z0-9_.-]{{1,{QUEUE_MAX_LENGTH}}}$")
#: The rules in words, for messages.
NAME_RULE = f"1-{NAME_MAX_LENGTH} characters of letters, digits and '_.:-'"
QUEUE_RULE = f"1-{QUEUE_MAX_LENGTH} characters of letters, digits and '_.-'"


def is_name(value: Any) -> bool:
    """Whether ``value`` is a well-formed job type name."""
    # fullmatch: the pattern's "$" would also match before a trailing newline.
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None


def is_queue(value: Any) -> bool:
    """Whether ``value`` is a well-formed queue name."""
    return isinstance(value, str) and QUEUE_PATTERN.fullmatch(value) is not None
