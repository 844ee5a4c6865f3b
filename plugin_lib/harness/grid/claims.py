"""Claims on units, so that several local ``grid run`` processes on one run store share its
units instead of queueing on them.

A unit's record is computed under its own lock (``run_store.unit_lock``), so two processes that
reach one unit never compute it twice; but the second one waits on that lock, idle, for as long
as the unit takes (up to 19 minutes in wave 4), though other units were ready. A process now
claims a unit (``<results>/.grid-claims/<unit key>.lock``, a ``StoreLock``: a claim whose
process has ended is taken over) before computing it, and passes over one that another holds,
coming back to it when that one is done (then its record is read, not computed).
"""
from __future__ import annotations

from ...utils.locks import StoreLock
from .. import machine
from .units import Unit

CLAIMS = ".grid-claims"


def claim_lock(unit: Unit) -> StoreLock:
    return StoreLock(machine.results_dir(unit.profile) / CLAIMS / f"{unit.key}.lock")


class Claims:
    """The claims this process holds, by unit key; ``elsewhere``: the units passed over because
    another live process holds them, with its holder's ``host~pid``."""

    def __init__(self) -> None:
        self.held: dict[str, StoreLock] = {}
        self.elsewhere: dict[str, str] = {}

    def take(self, unit: Unit) -> bool:
        """Whether this process may compute ``unit`` now (it holds the claim)."""
        lock = claim_lock(unit)
        if not lock.acquire(blocking=False):
            holder = lock.holder() or {}
            self.elsewhere[unit.key] = f"{holder.get('host')}~{holder.get('pid')}"
            return False
        self.elsewhere.pop(unit.key, None)
        self.held[unit.key] = lock
        return True

    def release(self, unit: Unit) -> None:
        lock = self.held.pop(unit.key, None)
        if lock is not None:
            lock.release()

    def release_all(self) -> None:
        for lock in self.held.values():
            lock.release()
        self.held.clear()

    def waiting_note(self) -> str:
        """What an idle process waits for, for its progress bar."""
        key, holder = next(iter(self.elsewhere.items()))
        more = f" and {len(self.elsewhere) - 1} more" if len(self.elsewhere) > 1 else ""
        return f"waiting: {key}{more}, computed by {holder}"
