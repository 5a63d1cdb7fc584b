"""The binary search itself, on verdicts alone: no database, so every case
of it is a plain function call.

Rungs are numbered oldest first; both ends are rungs. The search assumes
one change between the ends, as `git bisect` does: the last rung with the
oldest end's verdict and the first one after it with the newest end's
verdict close in on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from matrix.models import FAILURES, Status
from matrix.models.bisection import BisectionState, Verdict


def verdict_of(status: str) -> str:
    """What a result says on the question "does this cell work here?":
    a pass is good, a failure of the kernel bad; the runner's trouble and
    the evidence that stops short of a run (lowered, built) say nothing."""
    if status == Status.PASS:
        return Verdict.GOOD
    if status in FAILURES and status != Status.INFRA_ERROR:
        return Verdict.BAD
    return Verdict.SKIP


# Results whose verdict is skip: never reused, as they answer nothing.
UNANSWERING = [s for s in Status.values if verdict_of(s) == Verdict.SKIP]


@dataclass(frozen=True)
class Decision:
    """The next rung to test, or the end of the search: its state, and the
    rungs that close in on the change (``old``: the last with the oldest
    end's verdict; ``new``: the first after it with the newest end's)."""

    rung: int | None = None
    state: str = BisectionState.RUNNING
    old: int | None = None
    new: int | None = None
    # An end that could not be tested, for STOPPED.
    end: int | None = None


def decide(*, rungs: int, verdicts: dict[int, str], testable: set[int]) -> Decision:
    """``verdicts``: rung -> verdict of those tested; ``testable``: the
    untested rungs a job can test now."""
    last = rungs - 1
    for end in (0, last):
        if end not in verdicts:
            if end in testable:
                return Decision(rung=end)
            return Decision(state=BisectionState.STOPPED, end=end)
    oldest, newest = verdicts[0], verdicts[last]
    if Verdict.SKIP in (oldest, newest):
        return Decision(
            state=BisectionState.STOPPED, end=0 if oldest == Verdict.SKIP else last
        )
    if oldest == newest:
        return Decision(state=BisectionState.NO_CHANGE, old=0, new=last)
    old = max(rung for rung, v in verdicts.items() if v == oldest)
    new = min(rung for rung, v in verdicts.items() if v == newest and rung > old)
    untested = [r for r in range(old + 1, new) if r not in verdicts and r in testable]
    if untested:
        middle = (old + new) / 2
        return Decision(rung=min(untested, key=lambda r: (abs(r - middle), r)))
    state = BisectionState.FOUND if new == old + 1 else BisectionState.NARROWED
    return Decision(state=state, old=old, new=new)
