"""The rule that marks a claim "a is above b" from each method's per-seed figures, written once:
the claims' checklists (:mod:`pflower.claims`) and the suites' ordering sentences
(:func:`pflower.bench.ordering_sentence`) apply it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOLDS = "holds"
WITHIN = "holds within spread only"
FAILS = "does not hold"
NO_VERDICT = "no verdict"
UNTESTED = "not tested here"
#: The marks in the order the counts show them.
MARKS = (HOLDS, WITHIN, FAILS, NO_VERDICT, UNTESTED)

#: What each mark means, as the checklists state it.
RULE = (
    "A claim compares two methods' final figures over their recorded seeds. The margin is how far "
    "the first is ahead of the second (in accuracy; in MiB sent, how far below the stated share of "
    "the second's it stays); the spread is the larger of the two methods' standard deviations over "
    "seeds (the second's times the share). **holds**: the margin exceeds the spread. **holds within "
    "spread only**: the margin is positive but does not exceed the spread (the paper's order, by a "
    'gap that does not count). **does not hold**: the margin is zero or negative; "within the '
    'spread" when its size does not exceed the spread (level), else beyond it. **no verdict**: '
    'fewer than two seeds of either method. A "no-worse" claim holds when the first is not '
    "behind, holds within spread only when it is behind by no more than the spread, and does not "
    'hold beyond that. **not tested here**: no record, with the reason. "Ahead on k of n seeds" '
    "counts the seeds both methods ran. Orderings the paper's tables give against its own methods "
    "(a baseline above a proposed method) are marked the same way and say so."
)


@dataclass(frozen=True)
class Verdict:
    mark: str
    detail: str


def verdict(a: list[float], b: list[float], *, lower: bool = False, factor: float = 1.0, kind: str = "above") -> Verdict:
    """The mark of "a is above b" (``lower``: a is below ``factor`` x b, for bytes; ``kind``
    "no-worse": a is not behind b beyond the spread) from each method's per-seed figures."""
    if len(a) < 2 or len(b) < 2:
        return Verdict(NO_VERDICT, f"{min(len(a), len(b))} seed: a difference needs at least two")
    ma, mb = float(np.mean(a)), float(np.mean(b))
    margin = factor * mb - ma if lower else ma - factor * mb
    spread = max(float(np.std(a, ddof=1)), factor * float(np.std(b, ddof=1)))
    detail = f"margin {margin:+.4f}, spread {spread:.4f}"
    if kind == "no-worse":
        if margin >= 0:
            return Verdict(HOLDS, detail)
        return Verdict(WITHIN if -margin <= spread else FAILS, detail)
    if margin > spread:
        return Verdict(HOLDS, detail)
    if margin > 0:
        return Verdict(WITHIN, detail)
    return Verdict(FAILS, detail + (", within the spread" if -margin <= spread else ""))
