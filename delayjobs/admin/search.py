"""The job list's search: ids and keys through their indexes; the payload on request.

A plain word is an id (``42``; ``#42`` for ids only) or a key, exact (``order:42``) or a
prefix ending in ``*`` (``order:4*``): each is one index lookup, whatever the table's size.
``payload: words`` searches the payload's text instead (every word must be in it): that
reads every row the other filters leave, so narrow the list first (status, job type,
queue, due) on a large table. Several words: jobs matching all of them.
"""

from __future__ import annotations

import json
import re

from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils.text import smart_split, unescape_string_literal

from delayjobs.models import DelayedJob

#: "#42" searches ids only; plain digits search ids and keys.
ID_TERM = re.compile(r"#?(\d+)")
#: Ids above this cannot exist (a 64-bit primary key); the lookup would overflow.
MAX_ID = 2**63 - 1
PAYLOAD = "payload:"
#: A key term ending in this is a prefix.
PREFIX = "*"


def terms_of(search_term: str) -> list[str]:
    """The words of a search, a quoted phrase being one word."""
    terms = [
        unescape_string_literal(bit) if bit[:1] in "\"'" and bit[-1:] == bit[:1] else bit
        for bit in smart_split(search_term)
    ]
    return [term for term in terms if term]


def search(jobs: QuerySet[DelayedJob], search_term: str) -> QuerySet[DelayedJob]:
    """``jobs`` matching every word of ``search_term`` (see the module)."""
    text = search_term.strip()
    if text[: len(PAYLOAD)].lower() == PAYLOAD:
        return _in_payload(jobs, terms_of(text[len(PAYLOAD) :]))
    for term in terms_of(text):
        jobs = jobs.filter(_id_or_key(term))
    return jobs


def _id_or_key(term: str) -> Q:
    id_match = ID_TERM.fullmatch(term)
    if id_match:
        pk = int(id_match.group(1))
        by_id = Q(pk=pk) if pk <= MAX_ID else Q(pk__in=[])
        if term.startswith("#"):
            return by_id
        return by_id | Q(key=term)
    if term.endswith(PREFIX) and len(term) > len(PREFIX):
        # A LIKE 'prefix%' that the key index (varchar_pattern_ops) serves.
        return Q(key__startswith=term[: -len(PREFIX)])
    return Q(key=term)


def _in_payload(jobs: QuerySet[DelayedJob], terms: list[str]) -> QuerySet[DelayedJob]:
    if not terms:
        return jobs
    # The payload's JSON as text: jsonb::text on PostgreSQL, the stored text on SQLite.
    # alias, not annotate: it is filtered on, never selected.
    jobs = jobs.alias(payload_text=Cast("payload", TextField()))
    for term in terms:
        condition = Q(payload_text__icontains=term)
        # SQLite keeps the JSON as Django wrote it, with non-ASCII characters, quotes and
        # backslashes escaped: look for that spelling too.
        escaped = json.dumps(term)[1:-1]
        if escaped != term:
            condition |= Q(payload_text__icontains=escaped)
        jobs = jobs.filter(condition)
    return jobs
