"""Converting between the engine's objects and the internal stream messages (ids and sparse q only)."""

from __future__ import annotations

import torch

from specserve.proto.v1 import internal_pb2 as pb

from .batching import StepResult
from .acceptance import SamplingParams, SparseDist, Outcome, one_hot
from .drafting import DraftTokens


def sampling_message(sampling: SamplingParams, seed: int) -> pb.Sampling:
    return pb.Sampling(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed)


def sampling_from(msg: pb.Sampling) -> SamplingParams:
    # float32 on the wire: 0.7 arrives as 0.699999988; both sides decode the same value.
    return SamplingParams(temperature=msg.temperature, top_k=msg.top_k, top_p=msg.top_p)


def proposal_message(proposal: DraftTokens, greedy: bool, seconds: float = 0.0,
                     info: pb.PassInfo | None = None) -> pb.Proposal:
    """Greedy proposals are one-hot, so only their ids travel. One that came over a stream goes on as it came."""
    if proposal.wire is not None:
        return proposal.wire
    msg = pb.Proposal(ids=proposal.ids, seconds=seconds, pass_info=info, parents=proposal.parents or [])
    if not greedy:
        for ids, probs in zip(proposal.q.ids.tolist(), proposal.q.probs.tolist(), strict=True):
            msg.q.add(ids=ids, probs=probs)
    return msg


def proposal_from(msg: pb.Proposal) -> DraftTokens:
    ids = list(msg.ids)
    if not ids:
        return DraftTokens.empty()
    parents = list(msg.parents) or None
    if not msg.q:
        return DraftTokens(ids, one_hot(torch.tensor(ids)), parents, wire=msg)
    if len(msg.q) != len(ids) or any(len(row.ids) != len(row.probs) for row in msg.q):
        raise ValueError(f"proposal of {len(ids)} tokens carries {len(msg.q)} malformed q rows")
    width = max(len(row.ids) for row in msg.q)
    q_ids = torch.zeros(len(ids), width, dtype=torch.long)  # padding: probability 0, any id
    q_probs = torch.zeros(len(ids), width)
    for i, row in enumerate(msg.q):
        q_ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
        q_probs[i, : len(row.probs)] = torch.tensor(row.probs)
    return DraftTokens(ids, SparseDist(q_ids, q_probs), parents, wire=msg)


def pass_info(done: StepResult) -> pb.PassInfo:
    return pb.PassInfo(tokens=done.pass_tokens, sessions=done.pass_sessions, queue_seconds=done.queue_seconds)


def verdict_message(verdict: Outcome) -> pb.Verdict:
    return pb.Verdict(num_accepted=verdict.num_accepted, token=verdict.token, path=verdict.path)

