"""Every status change of a job, in one place: the state machine of
docs/explanation/lifecycle.md. Imports the foundation (``delayjobs.core``, models,
exceptions) and the definitions (job types, lanes) only, never Redis; the transitions that
make jobs due again return index entries (``delayjobs.lanes``) for the caller to hand to
the index.
"""

from delayjobs.transitions.changes import cancel, move, retry
from delayjobs.transitions.claims import CLAIM_TOLERANCE, Candidate, claim, claim_due, lease_start
from delayjobs.transitions.leases import (
    give_back,
    reap_expired_leases,
    renew_leases,
    still_claimed,
    take_over,
)
from delayjobs.transitions.limiter import (
    Held,
    LimitedClaim,
    claim_limited,
    due_limited_ids,
    prune_limit_rows,
)
from delayjobs.transitions.outcomes import Outcome, record_outcome_if_held, record_outcomes
from delayjobs.transitions.reservations import Reservation, drop_reservations

__all__ = [
    "CLAIM_TOLERANCE",
    "Candidate",
    "Held",
    "LimitedClaim",
    "Outcome",
    "Reservation",
    "cancel",
    "claim",
    "claim_due",
    "claim_limited",
    "drop_reservations",
    "due_limited_ids",
    "give_back",
    "lease_start",
    "move",
    "prune_limit_rows",
    "reap_expired_leases",
    "record_outcome_if_held",
    "record_outcomes",
    "renew_leases",
    "retry",
    "still_claimed",
    "take_over",
]
