"""Converting between the engine's objects and the internal stream messages (ids and sparse q only)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import torch

from specserve.proto.v1 import internal_pb2 as pb

from .batching import StepResult
from .acceptance import SparseDist, Outcome, one_hot
from .sampling import LogitsProcessing, SamplingParams
from .draft_steps import DraftStep, Fork
from .drafting import Alternative, DraftTokens
from .logprobs import TokenLogprobs
from .proposing import AUX_HIDDEN, NO_EXTRAS, VERIFIER_NEXT, HiddenRows

log = logging.getLogger("specserve.workers")


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


def alternatives_message(msg: pb.Proposal, alternatives: Sequence[Alternative]) -> None:
    """Each token's alternative (workers/drafting.py) into ``msg``'s runner-up fields."""
    msg.runner_up.extend(a.runner_up for a in alternatives)
    msg.token_p.extend(a.token_p for a in alternatives)
    msg.runner_up_p.extend(a.runner_up_p for a in alternatives)


def proposal_from(msg: pb.Proposal) -> DraftTokens:
    """The proposal a message carries (ValueError: malformed), its q decoded only when read."""
    ids = list(msg.ids)
    if not ids:
        return DraftTokens.empty()
    if msg.q and (len(msg.q) != len(ids) or any(len(row.ids) != len(row.probs) for row in msg.q)):
        raise ValueError(f"proposal of {len(ids)} tokens carries {len(msg.q)} malformed q rows")
    return WireTokens(msg, ids, list(msg.parents) or None)


class WireTokens(DraftTokens):
    """A proposal as it came over a stream. Its ids are read at once; its q only when something reads
    it: the router forwards the message to the target as it came (``proposal_message``), and a greedy
    verdict reads no q, so most proposals never build one (a sampled one's tensors cost the router
    about 50 us a proposal on the development machine). A chain cut shorter keeps its encoding."""

    def __init__(self, message: pb.Proposal, ids: list[int], parents: list[int] | None) -> None:
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "wire", message)

    @functools.cached_property
    def q(self) -> SparseDist:
        msg, ids = self.wire, self.ids
        if not msg.q:  # greedy: one-hot on the ids
            return one_hot(torch.tensor(ids))
        width = max(len(row.ids) for row in msg.q)
        q_ids = torch.zeros(len(ids), width, dtype=torch.long)  # padding: probability 0, any id
        q_probs = torch.zeros(len(ids), width)
        for i, row in enumerate(msg.q):
            q_ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
            q_probs[i, : len(row.probs)] = torch.tensor(row.probs)
        return SparseDist(q_ids, q_probs)

    def first(self, n: int) -> DraftTokens:
        if len(self.ids) <= n or self.parents is not None:
            return super().first(n)
        cut = pb.Proposal(ids=self.wire.ids[:n], q=self.wire.q[:n], seconds=self.wire.seconds)
        return WireTokens(cut, self.ids[:n], None)


def pass_info(done: StepResult) -> pb.PassInfo:
    return pb.PassInfo(tokens=done.pass_tokens, sessions=done.pass_sessions, queue_seconds=done.queue_seconds)


def verdict_message(verdict: Outcome) -> pb.Verdict:
    return pb.Verdict(num_accepted=verdict.num_accepted, token=verdict.token, path=verdict.path)



WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hidden_message(hidden: HiddenRows) -> pb.HiddenStates:
    """Hidden states packed in their own dtype (bfloat16 travels as its raw 16 bits)."""
    rows = hidden.rows.detach().contiguous().cpu()
    dtype = next((name for name, d in WIRE_DTYPES.items() if d == rows.dtype), None)
    if dtype is None:
        rows, dtype = rows.float(), "float32"
    raw = rows.view(torch.int16) if rows.dtype == torch.bfloat16 else rows
    return pb.HiddenStates(start=hidden.start, rows=rows.shape[0], width=rows.shape[1] if rows.dim() > 1 else 0,
                           dtype=dtype, data=raw.numpy().tobytes())


def hidden_from(msg: pb.HiddenStates) -> HiddenRows:
    if msg.dtype not in WIRE_DTYPES:
        raise ValueError(f"hidden states of dtype {msg.dtype!r}: expected one of {', '.join(WIRE_DTYPES)}")
    dtype = WIRE_DTYPES[msg.dtype]
    if len(msg.data) != msg.rows * msg.width * dtype.itemsize:
        raise ValueError(f"hidden states of {msg.rows} x {msg.width} {msg.dtype} values hold {len(msg.data)} bytes")
    if not msg.rows:
        return HiddenRows(msg.start, torch.zeros(0, msg.width, dtype=dtype))
    raw = torch.frombuffer(bytearray(msg.data), dtype=torch.int16 if dtype == torch.bfloat16 else dtype)
    return HiddenRows(msg.start, raw.view(dtype).view(msg.rows, msg.width))


def step_message(step: DraftStep, aux: pb.HiddenStates | None = None) -> pb.DraftStep:
    """A draft session's step on its stream; ``aux``: its hidden states packed already (the router
    forwards a replica's as they came), else the step's own are packed."""
    message = pb.DraftStep(keep=step.keep, append=step.append, k=step.k, min_confidence=step.min_confidence,
                           min_tokens=step.min_tokens, guess=step.guess, adopt=step.adopt,
                           drop_previous=step.drop_previous)
    if step.fork is not None:
        message.fork.CopyFrom(pb.Fork(keep=step.fork.keep, token=step.fork.token, k=step.fork.k))
    if aux is not None or step.hidden is not None:
        message.aux.CopyFrom(aux if aux is not None else hidden_message(step.hidden))
    return message


def step_from(message: pb.DraftStep) -> DraftStep:
    """The step a draft worker's session is sent (ValueError: hidden states that do not unpack)."""
    fork = message.fork
    return DraftStep(message.keep, tuple(message.append), message.k, message.min_confidence,
                     max(message.min_tokens, 1), message.guess, message.adopt,
                     Fork(fork.keep, fork.token, fork.k) if message.HasField("fork") else None,
                     hidden_from(message.aux) if message.HasField("aux") else None, message.drop_previous)


def extras_message(reply: pb.VerifyReply, extras: Mapping[str, object], greedy: bool) -> None:
    """What a verify pass took for the request's proposer (``Verified.extras``: workers/pass_hooks.py)
    into its reply: hidden states packed in their dtype, or the proposal drafted on the verifier."""
    if (hidden := extras.get(AUX_HIDDEN)) is not None:
        reply.aux.CopyFrom(hidden_message(hidden))
    if (drafted := extras.get(VERIFIER_NEXT)) is not None:
        reply.next.CopyFrom(proposal_message(drafted, greedy))


def extras_from(reply: pb.VerifyReply) -> Mapping[str, object]:
    """A reply's ``Verified.extras``: its hidden states as they came (the router never unpacks them:
    they go on to the draft worker), or the proposal drafted on the verifier (a malformed one is
    none: a target-only step)."""
    if reply.HasField("aux"):
        return {AUX_HIDDEN: reply.aux}
    if reply.HasField("next"):
        try:
            return {VERIFIER_NEXT: proposal_from(reply.next)}
        except ValueError as exc:
            log.warning("a target replica sent a malformed proposal (%s); the next step goes target-only", exc)
            return {VERIFIER_NEXT: None}
    return NO_EXTRAS


def join_hidden(first: pb.HiddenStates | None, then: pb.HiddenStates) -> pb.HiddenStates:
    """Two replies' hidden states as one message, still packed (``then`` starts where ``first`` ends,
    or restarts from an earlier position: a replica that took the request over sends them all)."""
    if first is None or then.start <= first.start:
        return then
    if then.start != first.start + first.rows or (then.width, then.dtype) != (first.width, first.dtype):
        raise ValueError(f"hidden states from {then.start} do not follow rows {first.start}..{first.start + first.rows}")
    return pb.HiddenStates(start=first.start, rows=first.rows + then.rows, width=first.width, dtype=first.dtype,
                           data=first.data + then.data)


def logprobs_message(logprobs: TokenLogprobs) -> pb.Logprobs:
    """Packed: every token's alternatives in one array (n each)."""
    return pb.Logprobs(chosen=logprobs.chosen, top_ids=[i for ids in logprobs.top_ids for i in ids],
                       top_logprobs=[v for values in logprobs.top for v in values])


def logprobs_from(msg: pb.Logprobs, top: int) -> TokenLogprobs:
    """The reply's logprobs, ``top`` alternatives a token (the open's top_logprobs)."""
    ids, values = list(msg.top_ids), list(msg.top_logprobs)
    return TokenLogprobs(list(msg.chosen), [ids[i * top : (i + 1) * top] for i in range(len(msg.chosen))],
                         [values[i * top : (i + 1) * top] for i in range(len(msg.chosen))])


def processing_message(processing: LogitsProcessing, output_start: int) -> pb.Processing:
    return pb.Processing(bias_ids=[t for t, _ in processing.logit_bias], bias_values=[b for _, b in processing.logit_bias],
                         presence_penalty=processing.presence_penalty,
                         frequency_penalty=processing.frequency_penalty, output_start=output_start)


def processing_from(msg: pb.Processing) -> LogitsProcessing:
    # float32 on the wire: both sides of a replay decode the same values.
    return LogitsProcessing(tuple(zip(msg.bias_ids, msg.bias_values, strict=True)), msg.presence_penalty,
                            msg.frequency_penalty)
