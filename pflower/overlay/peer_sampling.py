"""Gossip peer sampling (a Cyclon/Newscast-style shuffle with the "healer" merge).

Every client keeps a *view*: at most ``size`` peer ids with ages (rounds since the entry was
fresh). Each round it ages its entries, shuffles with its oldest peer (sends itself at age 0
and a random half-view, gets a random half-view back) and merges what it hears: the youngest
entry per peer wins, itself is never kept, and over ``size`` the oldest entries go. No client
knows the whole membership: a client that stops answering is dropped by whoever fails to reach
it and ages out of everyone else's view; a new client joins by shuffling with any one contact.
Randomness comes from the caller's generator (seeded per client and round), so the overlay is
deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class View:
    owner: int
    size: int
    ages: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_lists(cls, owner: int, size: int, ids: list[int], ages: list[int]) -> View:
        return cls(owner, size, {int(i): int(a) for i, a in zip(ids, ages)})

    def to_lists(self) -> tuple[list[int], list[int]]:
        ids = sorted(self.ages)
        return ids, [self.ages[i] for i in ids]

    @property
    def peers(self) -> list[int]:
        return sorted(self.ages)

    def tick(self) -> None:
        """One round passed: every entry is a round older."""
        self.ages = {i: a + 1 for i, a in self.ages.items()}

    def oldest(self) -> int | None:
        """The shuffle partner: the oldest entry (lowest id on ties); None for an empty view."""
        return min(self.ages, key=lambda i: (-self.ages[i], i)) if self.ages else None

    def sample(self, k: int, rng: np.random.Generator, exclude: frozenset[int] = frozenset()) -> dict[int, int]:
        """Up to ``k`` random entries (not in ``exclude``)."""
        ids = [i for i in self.peers if i not in exclude]
        chosen = rng.choice(len(ids), size=min(k, len(ids)), replace=False) if ids else []
        return {ids[j]: self.ages[ids[j]] for j in sorted(chosen)}

    def shuffle_buffer(self, rng: np.random.Generator, partner: int | None = None) -> dict[int, int]:
        """What this client sends in a shuffle: itself (age 0) and a random half-view."""
        exclude = frozenset() if partner is None else frozenset({partner})
        return {self.owner: 0, **self.sample(max(1, self.size // 2) - 1, rng, exclude)}

    def reply_buffer(self, rng: np.random.Generator, initiator: int) -> dict[int, int]:
        """What this client answers a shuffle with: a random half-view (without the initiator)."""
        return self.sample(max(1, self.size // 2), rng, frozenset({initiator}))

    def merge(self, received: dict[int, int]) -> None:
        """Take the youngest entry per peer, never itself; keep the ``size`` youngest."""
        for i, age in received.items():
            if i != self.owner and (i not in self.ages or age < self.ages[i]):
                self.ages[i] = age
        if len(self.ages) > self.size:
            keep = sorted(self.ages, key=lambda i: (self.ages[i], i))[: self.size]
            self.ages = {i: self.ages[i] for i in keep}

    def remove(self, peer: int) -> None:
        """A peer that did not answer: drop it."""
        self.ages.pop(peer, None)


def buffer_problem(ids, ages, num_clients: int, max_len: int) -> str | None:
    """Why a received shuffle buffer is malformed (lists of client ids in range and ages >= 0, as
    long as each other, at most ``max_len`` entries), or None if it is well formed."""
    if not isinstance(ids, list) or not isinstance(ages, list) or len(ids) != len(ages):
        return "ids and ages must be two lists of one length"
    if len(ids) > max_len:
        return f"{len(ids)} entries, more than a view holds ({max_len})"
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_clients for i in ids):
        return f"ids must be client ids in 0..{num_clients - 1}"
    if not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in ages):
        return "ages must be integers >= 0"
    return None
