"""The admission queue: bounded, prioritised, fair between tenants.

Theory of operation
-------------------
Entries wait in *bands* by priority (lower number first, as in vLLM's ``priority``). Inside a band,
each tenant has its own FIFO, and tenants take turns: :meth:`FairQueue.pop` serves the first tenant
in the band's rotation and moves it to the back, so one tenant's burst cannot starve another's single
request. The queue is bounded twice, by entries and by the sum of the entries' tokens (a few huge
prompts fill it as surely as many small ones); :meth:`FairQueue.push` raises :class:`QueueFullError`
rather than grow. :meth:`FairQueue.remove` takes an entry out from anywhere (its client left, or its
wait ran out) in O(1) amortised time. The structure is pure: no clocks, no futures, no I/O; the
controller around it owns waiting and timing.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueFullError(Exception):
    """The queue is at its entry or token limit."""


@dataclass(eq=False)
class QueueEntry(Generic[T]):
    """One waiting request: its priority, tenant, size in tokens and payload."""

    priority: int
    tenant: str
    tokens: int
    payload: T
    removed: bool = field(default=False, repr=False)


class FairQueue(Generic[T]):
    """See the module docstring."""

    def __init__(self, max_entries: int, max_tokens: int) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._bands: dict[int, OrderedDict[str, deque[QueueEntry[T]]]] = {}
        self._size = 0
        self._tokens = 0
        self._garbage = 0  # removed entries still sitting in a FIFO

    def __len__(self) -> int:
        return self._size

    @property
    def tokens(self) -> int:
        """Tokens of all waiting entries."""
        return self._tokens

    def has_room(self, tokens: int) -> bool:
        """Whether an entry of ``tokens`` would fit."""
        return self._size < self.max_entries and self._tokens + tokens <= self.max_tokens

    def push(self, entry: QueueEntry[T]) -> None:
        """Add ``entry`` at the back of its tenant's FIFO; raises :class:`QueueFullError` when full."""
        if not self.has_room(entry.tokens):
            raise QueueFullError
        band = self._bands.setdefault(entry.priority, OrderedDict())
        band.setdefault(entry.tenant, deque()).append(entry)
        self._size += 1
        self._tokens += entry.tokens

    def _first_band(self) -> OrderedDict[str, deque[QueueEntry[T]]] | None:
        while self._bands:
            priority = min(self._bands)
            band = self._bands[priority]
            for tenant in list(band):
                fifo = band[tenant]
                while fifo and fifo[0].removed:
                    fifo.popleft()
                    self._garbage = max(0, self._garbage - 1)
                if not fifo:
                    del band[tenant]
            if band:
                return band
            del self._bands[priority]
        return None

    def peek(self) -> QueueEntry[T] | None:
        """The entry :meth:`pop` would return, without removing it."""
        band = self._first_band()
        if band is None:
            return None
        return band[next(iter(band))][0]

    def peek_many(self, limit: int) -> list[QueueEntry[T]]:
        """Up to ``limit`` live entries of the first priority band, in the order :meth:`pop` serves them."""
        band = self._first_band()
        if band is None:
            return []
        fifos = [list(islice((e for e in fifo if not e.removed), limit)) for fifo in band.values()]
        entries: list[QueueEntry[T]] = []
        depth = 0
        while len(entries) < limit and any(depth < len(f) for f in fifos):
            entries.extend(f[depth] for f in fifos if depth < len(f))
            depth += 1
        return entries[:limit]

    def next_tenant_entries(self) -> list[QueueEntry[T]]:
        """Every live entry of the tenant whose turn it is (first priority band), oldest first."""
        band = self._first_band()
        if band is None:
            return []
        return [e for e in band[next(iter(band))] if not e.removed]

    def take(self, entry: QueueEntry[T]) -> None:
        """Remove ``entry`` and pass the turn to the next tenant, as :meth:`pop` does."""
        band = self._bands.get(entry.priority)
        if self.remove(entry) and band is not None and entry.tenant in band:
            band.move_to_end(entry.tenant)

    def pop(self) -> QueueEntry[T] | None:
        """Remove and return the next entry (lowest priority number, tenants in turn), or ``None``."""
        band = self._first_band()
        if band is None:
            return None
        tenant = next(iter(band))
        fifo = band[tenant]
        entry = fifo.popleft()
        band.move_to_end(tenant)
        if not fifo:
            del band[tenant]
        self._account(entry)
        return entry

    def remove(self, entry: QueueEntry[T]) -> bool:
        """Take ``entry`` out wherever it waits; ``False`` when it is no longer queued."""
        if entry.removed:
            return False
        self._account(entry)
        self._garbage += 1
        if self._size == 0:
            self._bands.clear()
            self._garbage = 0
        elif self._garbage > max(64, self._size):
            self._compact()
        return True

    def _compact(self) -> None:
        """Drop removed entries from every FIFO (keeps memory bounded when many clients leave)."""
        for band in self._bands.values():
            for tenant in list(band):
                live = deque(e for e in band[tenant] if not e.removed)
                if live:
                    band[tenant] = live
                else:
                    del band[tenant]
        self._garbage = 0

    def _account(self, entry: QueueEntry[T]) -> None:
        entry.removed = True
        self._size -= 1
        self._tokens -= entry.tokens

    def position(self, entry: QueueEntry[T]) -> int:
        """How many entries are served before ``entry`` in the current order (0 = next); O(n)."""
        ahead = 0
        for priority in sorted(self._bands):
            band = self._bands[priority]
            if priority < entry.priority:
                ahead += sum(1 for fifo in band.values() for e in fifo if not e.removed)
                continue
            if priority > entry.priority:
                break
            fifos = [[e for e in fifo if not e.removed] for fifo in band.values()]
            mine = next((f for f in fifos if entry in f), None)
            if mine is None:
                return ahead
            index = mine.index(entry)
            rank = fifos.index(mine)
            # tenants take turns, one entry each: before this entry's turn come `index` full rounds,
            # plus one more entry from every tenant ahead of this one in the rotation
            ahead += index
            ahead += sum(
                min(len(f), index + (1 if i < rank else 0)) for i, f in enumerate(fifos) if f is not mine
            )
        return ahead

    def drain(self) -> list[QueueEntry[T]]:
        """Remove and return every waiting entry."""
        entries = []
        while (entry := self.pop()) is not None:
            entries.append(entry)
        return entries
