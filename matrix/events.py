"""What one part of the server tells the others, without importing them.

The fleet stores results; the gate (and whatever else cares) reacts. The
sender knows nothing of its receivers, so imports run one way: down, from
the gate to the fleet and the catalogue (docs/layout.md). Receivers run in
the sender's transaction, as a call would.
"""

from __future__ import annotations

from django.dispatch import Signal

# Sent by ingest once a batch of results and their cells is written, inside
# its transaction; ``results`` are the stored Result rows.
results_stored = Signal()

# Sent by ingest for every batch it checked, inside its transaction (after
# ``results_stored`` where any were stored); ``outcomes`` are its Outcome
# rows (``status``: stored, duplicate or refused; ``reason``; ``code``).
results_checked = Signal()

# Sent by the alerts once alerts open or reopen, inside the transaction that
# opened them; ``opened`` and ``reopened`` are Alert rows.
alerts_changed = Signal()

# Sent by the gate when a proposal's state changes (an evaluation, a
# decision, a rollout), inside its transaction; ``proposal``, ``before``
# (the state it left) and ``actor`` (a user or None).
proposal_state_changed = Signal()

# Sent when a bisection across toolchains ends (names a release, narrows to
# a range, finds no change or stops), inside its transaction;
# ``bisection`` is the Bisection row, its ``conclusion`` written.
bisection_concluded = Signal()
