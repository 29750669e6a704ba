"""Per-request speculation statistics (the names follow vLLM's spec-decode metrics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

NOT_SUMMED = frozenset({"accepted_per_position", "tested_per_position", "seed"})  # merged by position / per request


@dataclass
class SpecStats:
    proposed: int = 0  # draft tokens sent for verification
    accepted: int = 0  # draft tokens the target kept
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps whose i-th draft was kept
    tested_per_position: list[int] = field(default_factory=list)  # [i]: steps that reached their i-th draft
    target_passes: int = 0  # verify (or plain decode) forward passes of the target
    rejections: int = 0  # steps that ended on a rejected draft token (the rest accepted all k)
    draft_passes: int = 0  # forward passes of the draft
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    lookaheads: int = 0  # proposals drafted while the target verified the previous one (service, greedy)
    lookahead_hits: int = 0  # of those, used: the verdict accepted everything and matched the guess
    seed: int | None = None

    def record_step(self, k: int, num_accepted: int) -> None:
        self.target_passes += 1
        self.proposed += k
        self.accepted += num_accepted
        self.rejections += int(num_accepted < k)
        _count_first(self.accepted_per_position, num_accepted, k)
        _count_first(self.tested_per_position, min(num_accepted + 1, k), k)  # tested up to the first rejection

    def add(self, other: SpecStats) -> None:
        """Sum another request's counts into these (for per-task aggregates)."""
        for f in fields(self):  # every counter, so a counter added later is summed too
            if f.name not in NOT_SUMMED:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        for mine, theirs in ((self.accepted_per_position, other.accepted_per_position),
                             (self.tested_per_position, other.tested_per_position)):
            for i, n in enumerate(theirs):
                if i == len(mine):
                    mine.append(0)
                mine[i] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (vLLM's definition); falls with k even at a fixed alpha."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability (Leviathan et al.'s alpha), the quantity the cost model uses.

        Each step tests draft tokens in order until the first rejection, so accepted tests and
        rejections are the successes and failures of independent trials: alpha = a / (a + r).
        """
        trials = self.accepted + self.rejections
        return self.accepted / trials if trials else 0.0

    @property
    def alpha_per_position(self) -> list[float]:
        """[i]: acceptance of the i-th draft token among steps that reached it (the cost model takes
        these to be equal; in practice the first positions are easier)."""
        return [a / t for a, t in zip(self.accepted_per_position, self.tested_per_position, strict=True) if t]

    @property
    def tokens_per_pass(self) -> float:
        # Every pass commits its accepted drafts plus one target token.
        return (self.accepted + self.target_passes) / self.target_passes if self.target_passes else 0.0

    def cost_ratio(self, target_only: SpecStats) -> float:
        """c: one draft forward pass of these runs over one forward pass of ``target_only``'s."""
        draft_step = self.draft_seconds / max(1, self.draft_passes)
        target_step = target_only.verify_seconds / max(1, target_only.target_passes)
        return draft_step / target_step if target_step else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"acceptance_rate": self.acceptance_rate, "alpha": self.alpha,
                               "tokens_per_pass": self.tokens_per_pass}


def _count_first(counts: list[int], n: int, width: int) -> None:
    """counts[i] += 1 for i < n, growing counts to `width` positions first."""
    if len(counts) < width:
        counts.extend([0] * (width - len(counts)))
    for i in range(n):
        counts[i] += 1
