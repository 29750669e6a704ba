"""A head fed by the target's hidden states (an MTP module, an EAGLE-3 head) drafting where the target
verifies: on the target replica, after each verify pass, with no trip to a draft worker.

``FedGuesser`` is a target session's side (its ``PassHook``, as Medusa heads' is): every
pass of the session leaves it the hidden states of the positions it committed, and after a verdict
the session owes its next proposal. ``FedGuessBatch`` drafts what the pass's sessions owe together
once its verdicts are in (the steps' ``after_pass``): one pass of the head over every session's
newly committed positions, then one per drafted token, each shared by all of them
(``FedHead.step_many``), as vLLM runs its MTP and EAGLE drafters after the target's forward.

What it proposes is what the same head drafts in process or on a draft worker (``HeadState``,
``HeadRun``): the same draws, keyed by the request's seed, the head's name and the position, and
the same hidden states (a verdict's, cut to the same window: ``proposing.windowed``); the reply
carries ``depth`` tokens and the request's proposer cuts them to its k (a run's first tokens do not
depend on how many follow). The router relays them as it relays Medusa heads' guesses
(``VerifyReply.next``). Before the first verdict there is nothing to draft from: the first step is
target-only, as a head's is anywhere. A session whose drafting fails goes target-only for good
(``FedGuesser.gone``): never another session's proposal, never the pass's verdicts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from ..pass_hooks import DraftsHere, committed_rows
from ..proposing import HiddenRows, windowed
from .eagle3 import FedHead
from ..sim_device import held
from .proposer import HeadRun, HeadState, head_shape

log = logging.getLogger("specserve.workers")
# A run's rows in one pass, at most: its first feeds every position committed since the last run
# (a prompt's: at most the window's).
PASS_ROWS = 2**31


class FedGuessBatch:
    """The proposals one head owes the sessions a pass verified, drafted together (``flush``)."""

    def __init__(self, head: FedHead) -> None:
        self.head = head
        self.pending: list[FedGuesser] = []

    def owe(self, guesser: FedGuesser) -> None:
        """``guesser.next`` gets the head's proposal after the committed tokens it holds."""
        self.pending.append(guesser)

    @torch.inference_mode()
    def flush(self) -> None:
        pending, self.pending = self.pending, []
        runs: list[tuple[FedGuesser, HeadRun]] = []
        for guesser in pending:
            try:
                runs.append((guesser, HeadRun(guesser.state, guesser.depth)))
            except Exception as exc:  # noqa: BLE001 - hidden states missing (ProposerGone), a cache too small
                guesser.drop(str(exc))
        active = [entry for entry in runs if entry[1].result is None]
        while active:
            try:
                segments, started = [run.plan(PASS_ROWS) for _, run in active], time.perf_counter()
                outputs = self.head.step_many([segment.run_on(self.head) for segment in segments])
                held(self.head, started, segments, head_shape)  # simulated (in process): its modelled time
            except Exception as exc:  # noqa: BLE001 - their shared pass: each of them goes target-only
                log.exception("a head on the target replica failed a pass of %d sessions", len(active))
                for guesser, _ in active:
                    guesser.drop(f"its head's pass failed ({type(exc).__name__})")
                break
            going = []
            for entry, output in zip(active, outputs, strict=True):
                try:
                    if not entry[1].advance(output):
                        going.append(entry)
                except Exception as exc:  # noqa: BLE001 - this session's draw: the others' go on
                    entry[0].drop(f"drafting failed ({type(exc).__name__}: {exc})")
            active = going
        for guesser, run in runs:
            if not guesser.gone:
                guesser.next = run.result


class FedGuesser(DraftsHere):
    """One session's side of a head drafting here, the hook its target session serves it by
    (workers/pass_hooks.py): its tokens and hidden states (``state``), and the tokens it proposes
    after each verdict (``depth``)."""

    def __init__(self, batch: FedGuessBatch, state: HeadState, depth: int, start: int = 0) -> None:
        self.batch = batch
        self.state = state
        self.depth = depth
        self.start = start  # the position of the next hidden state the session keeps
        self.rows: list[torch.Tensor] = []  # those of the positions committed since the last verdict
        self.gone = ""  # why it drafts no more (its session goes target-only); empty: it drafts

    def layers(self, segment) -> tuple[int, ...]:
        """The target layers a pass keeps of the segment's rows: every committed position feeds the head."""
        return () if self.gone else self.batch.head.config.aux_layers

    def passed(self, session, segment, proposed: int, kept: Sequence[int]) -> None:
        """Keep the hidden states of the segment's committed rows (all but its last ``proposed``,
        then the proposal's ``kept``); after a verdict (a segment with logits), hand the head those
        kept since the last one (as a verdict's reply carries them to a draft worker) and the
        session's committed tokens, and owe the next proposal."""
        if self.gone or segment.aux is None:
            return
        self.rows += committed_rows(segment, proposed, kept)
        if not segment.logits:  # a prefill chunk
            return
        rows, self.rows = torch.cat(self.rows), []
        self.state.add(windowed(HiddenRows(self.start, rows)))
        self.start += len(rows)
        committed = session.sequence.committed
        self.state.commit(committed[len(self.state.committed) :])
        self.batch.owe(self)

    def drop(self, why: str) -> None:
        """Draft no more for this session (said once): its next steps are target-only."""
        if not self.gone:
            log.warning("a head on the target replica drafts no more for a session: %s; it goes target-only", why)
            self.gone, self.rows = why or "failed", []
