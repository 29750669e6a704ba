"""How many tokens to draft at each step of one request: the adaptive-k schedules.

fixed       the request's k every step
heuristic   Hugging Face assisted generation's schedule: +2 after a step whose drafts were all
            accepted, -1 (to at least 1) after a rejection
confidence  k is a ceiling; the draft worker stops early after a token it gave less probability than
            the threshold (HF's assistant_confidence_threshold; AdaEDL stops on a similar bound)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftLength:
    schedule: str
    k: int
    k_max: int
    confidence_threshold: float = 0.0

    @property
    def min_confidence(self) -> float:
        """What the draft worker gets: 0 means draft all k."""
        return self.confidence_threshold if self.schedule == "confidence" else 0.0

    @property
    def most(self) -> int:
        """The most tokens a step of the request may ask for: the heuristic schedule moves k up to
        ``k_max``, the others keep it (a head drafting after each verdict drafts this many)."""
        return self.k_max if self.schedule == "heuristic" else self.k

    def next_k(self, proposed: int, accepted: int) -> int:
        """The k after a step that proposed `proposed` tokens and had `accepted` of them kept."""
        if self.schedule != "heuristic" or not proposed:
            return self.k
        return min(self.k + 2, self.k_max) if accepted == proposed else max(self.k - 1, 1)

    def update(self, proposed: int, accepted: int) -> None:
        self.k = self.next_k(proposed, accepted)
