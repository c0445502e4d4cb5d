"""The replica's prefix cache: vLLM's block pool with automatic prefix caching (`--enable-prefix-caching`),
in units of KV blocks (`PrefixCache`; the replica's docstring says what is modelled)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (only for annotations: the replica imports this module)
    from specbench.fleet.replica import _Request


@dataclass(eq=False)
class OwnRun:
    """Units `low` to `high` of one request's own (after its shared prefix), freed and still cached:
    evicted from `high` down (a request's blocks are freed last first). Only the request whose
    `free_run` it is looks for them."""

    low: int
    high: int


class PrefixCache:
    """vLLM's block pool with automatic prefix caching, in units of `unit_blocks` KV blocks.

    A unit is cached as soon as a step schedules its last token: a unit of a shared prefix under its
    key (one computed twice, each time before the other was cached, is cached twice; a hit takes the
    older copy), a unit of a request's own (no other request has its tokens) as that request's. A
    cached unit no running request holds is free but keeps its contents: the replica's free blocks
    count it, and a request that finds it takes it back instead of computing it (a preempted request
    its own units). New blocks come first from the free blocks that hold nothing cached (vLLM
    prepends those to its free queue) and then from the cached units in the order they were freed
    (appended to its end: least recently used first), a unit forgotten when its blocks are taken. A
    request's blocks are freed last block first, so its tail is evicted before its head. A request's
    own units are kept as one run, so a trace without shared prefixes costs no bookkeeping per unit."""

    def __init__(self, unit_blocks: int, unit_tokens: int) -> None:
        self.unit_blocks, self.unit_tokens = unit_blocks, unit_tokens
        self.copies: dict = {}  # key -> its cached shared units (ids), the oldest first
        self.key_of: dict[int, object] = {}  # cached shared unit -> its key
        self.users: dict[int, int] = {}  # cached shared unit -> the running requests holding it (0: free)
        # the free cached units, least recently freed first: shared unit ids and requests' own runs
        self.evictable: OrderedDict = OrderedDict()
        self.free_units = 0  # units the evictable entries hold
        self.next_unit = 0

    def found(self, keys: tuple) -> list[int]:
        """The cached units (the oldest copy of each) of the longest run of `keys` from the first that
        the cache holds."""
        units = []
        for key in keys:
            copies = self.copies.get(key)
            if not copies:
                break
            units.append(copies[0])
        return units

    def hits(self, request: _Request) -> tuple[list[int], int]:
        """The longest run of `request`'s units from its first that the cache holds, at most its tokens
        less one (vLLM computes the last prompt token again for its logits): its shared units found,
        and how many of its own units after them (left cached by a preemption)."""
        most = (request.to_prefill - 1) // self.unit_tokens
        shared = request.shared_units(self.unit_tokens)
        found = self.found(request.prefix[:min(most, shared)])
        run = request.free_run
        own = min(run.high - run.low, most - len(found)) if run is not None and len(found) == shared else 0
        return found, max(own, 0)

    def free_cached_blocks(self, units: list[int], own: int) -> int:
        """Of these hits, the blocks that sit free in the cache (taking them back takes free blocks)."""
        return self.unit_blocks * (own + sum(1 for unit in units if not self.users[unit]))

    def take_back(self, request: _Request, units: list[int], own: int) -> None:
        """`request` holds its hits from now on; what is left of its own cached run no one looks for."""
        for unit in units:
            if not self.users[unit]:
                del self.evictable[unit]
                self.free_units -= 1
            self.users[unit] += 1
        run, request.free_run = request.free_run, None
        if run is not None:
            run.low += own
            self.free_units -= own
            if run.low >= run.high:  # (evicted whole already, or taken back whole)
                self.evictable.pop(run, None)

    def evict_for(self, blocks: int, plain_free: int) -> None:
        """Forget the least recently freed units whose blocks `blocks` new blocks take beyond the
        `plain_free` free blocks that hold nothing cached."""
        while blocks > plain_free and self.evictable:
            entry = next(iter(self.evictable))
            if isinstance(entry, OwnRun):
                taken = min(entry.high - entry.low, -(-(blocks - plain_free) // self.unit_blocks))
                entry.high -= taken
                if entry.high <= entry.low:
                    del self.evictable[entry]
            else:
                taken = 1
                del self.evictable[entry]
                del self.users[entry]
                key = self.key_of.pop(entry)
                self.copies[key].remove(entry)
                if not self.copies[key]:
                    del self.copies[key]
            self.free_units -= taken
            plain_free += taken * self.unit_blocks

    def register(self, key) -> int:
        """A shared unit a request has computed: cached under `key`, held by it; its id."""
        unit = self.next_unit
        self.next_unit += 1
        self.copies.setdefault(key, []).append(unit)
        self.key_of[unit] = key
        self.users[unit] = 1
        return unit

    def release(self, request: _Request) -> tuple[int, int]:
        """`request` lets go of its cached units, its own first then its shared ones from the last: how
        many are free now (the rest other requests still hold), and how many it held. Its own units
        are those its computed tokens fill after its shared ones (every step cached them as it
        scheduled them: their count is known now)."""
        low = request.shared_units(self.unit_tokens)
        if len(request.units) == low:
            filled = min(request.computed, request.prompt + request.generated) // self.unit_tokens
            request.own_units = max(request.own_units, filled - low)
        held = freed = request.own_units
        if request.own_units:
            request.free_run = OwnRun(low, low + request.own_units)
            self.evictable[request.free_run] = None
        for unit in reversed(request.units):
            self.users[unit] -= 1
            if not self.users[unit]:
                self.evictable[unit] = None
                freed += 1
        held += len(request.units)
        self.free_units += freed
        request.units, request.own_units = [], 0
        return freed, held
