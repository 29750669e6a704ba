"""One forward pass over many sessions' tokens: ragged query lengths, ragged cache lengths.

The pass packs every session's new tokens into one row (batch 1, like a varlen kernel), so the
model's matrix products run once for all of them. Attention is the one part that must keep sessions
apart: each layer's attention, replaced by ``pooled_attention``, writes a session's new keys and
values into its pool region and attends its queries over that region's first positions only.
Positions (and so rotary embeddings) are each session's own.

Works for any causal LM whose attention layers go through transformers' attention interface (every
modern architecture in transformers 5: Llama, Mistral, Qwen, SmolLM, ...): the model is switched to
the ``specserve`` attention implementation, which behaves exactly as ``sdpa`` unless a pass is in
flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .config import ATTENTION_BLOCK
from .kv_pool import KVPool, Region

ATTENTION = "specserve"
GATHERED = "specserve_gathered_attention"  # the model's attribute: how its passes attend (use_pooled_attention)
# Output-head row counts a CPU GEMM runs slower than PADDED_GEMM_ROWS rows (see _padded_rows).
SLOW_GEMM_ROWS = (2, 3)
PADDED_GEMM_ROWS = 4


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: slices compared in C, halving (a draft's
    output grows by a token a call, so the whole shorter one is shared most of the time)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # a[:low] == b[:low] and a[:high + 1] != b[:high + 1]
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass
class Segment:
    """One session's part of a pass: ``tokens`` appended after its first ``start`` cached positions,
    and logits wanted for the last ``logits`` of them (0: a prefill chunk that needs none).

    With ``parents``, the last ``len(parents)`` tokens are a token tree (a proposal of several
    candidates per position): node i's parent is node ``parents[i]``, or -1 for the token before
    the tree. Each node sits at its depth's position and attends to what precedes the tree and to
    its own ancestors only, so one pass gives every node the logits a chain along its path would.
    The nodes take consecutive slots of the region in tree order whatever their positions.

    With ``fork`` = (seen, base), the segment continues a branch written apart from the sequence
    (a draft's pre-drafted alternative to its proposal under verification, workers/drafting.py): the
    branch forks after the region's first ``seen`` slots, its tokens take slots from ``base`` on
    (past anything the sequence itself may write), and each row attends to those ``seen`` slots
    and to the branch up to itself, at position ``seen`` + its place in the branch."""

    region: Region
    start: int
    tokens: Sequence[int]
    logits: int = 1
    parents: Sequence[int] | None = None
    # Hidden states wanted of every row (an EAGLE-3 head's aux layers, indices into transformers'
    # ``hidden_states``); the pass leaves them in ``aux``, [rows, layers * H] in the model's dtype.
    aux_layers: tuple[int, ...] = ()
    aux: torch.Tensor | None = None
    fork: tuple[int, int] | None = None
    # The step needs only its rows' argmax (a greedy verdict): the pass hands it [logits] ids, not
    # [logits, V] floats (``host_rows``).
    ids_only: bool = False

    def positions(self) -> list[int]:
        if self.fork is not None:
            seen, base = self.fork
            return list(range(seen + self.start - base, seen + self.start - base + len(self.tokens)))
        if self.parents is None:
            return list(range(self.start, self.start + len(self.tokens)))
        base = self.start + len(self.tokens) - len(self.parents)  # where the tree's first level sits
        return list(range(self.start, base)) + [base + d for d in tree_depths(self.parents)]


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth below the tree's root (its children are at depth 0)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


@dataclass
class PassLayout:
    """Where each segment's rows sit in the packed pass; read by every layer's attention."""

    pool: KVPool
    segments: Sequence[Segment]
    offsets: list[int]  # row where each segment starts; offsets[-1] = total rows
    blocks: list[list[AttentionBlock]]  # per segment, its attention calls, built once for every layer
    writes: list[KVWrite]  # the pass's new keys and values, per arena (with ``blocks``)
    gathered: list[GatheredGroup] | None = None  # the same pass as a few batched SDPA calls (see _gathered)


@dataclass
class AttentionBlock:
    """One attention call of a segment (``attention_blocks``): its rows in the packed pass, which
    attend over the region's first slots, ``keys`` in its arena, as ``mask`` says (None: all of them)."""

    rows: slice
    arena: int
    keys: slice  # arena positions: the region's start .. start + the block's last slot
    mask: torch.Tensor | None


@dataclass
class KVWrite:
    """A pass's new keys and values for one arena, written in one operation per layer: the packed
    pass's ``rows`` (None: all of them, in order) go to the arena positions ``slots``."""

    arena: int
    rows: torch.Tensor | None
    slots: torch.Tensor


@dataclass
class GatheredGroup:
    """Segments of one arena with the same number of rows, attended in one SDPA call: each
    segment's keys gathered from its region into a padded batch, padding masked off."""

    arena: int
    rows: torch.Tensor  # [S * q]: the segments' rows in the packed pass, segment-major
    slots: torch.Tensor  # [S * q]: the arena positions those rows' keys and values go to
    keys: torch.Tensor  # [S, L]: the arena positions each segment attends over, padded
    mask: torch.Tensor  # [S, 1, q, L]: which of them each row sees


def pooled_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention of one layer. query: [1, Hq, T, D]; key, value: [1, Hkv, T, D] (the new rows)."""
    layout: PassLayout | None = kwargs.pop("ragged_layout", None)
    if layout is None:  # an ordinary forward (scoring, the in-process engine): plain sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    layer, pool = module.layer_idx, layout.pool
    if layout.gathered is not None:
        return _gathered_attention(layout.gathered, pool, layer, query, key, value, scaling)
    # Every session's new keys and values first, one write per arena: the loop below then reads
    # them in place. (Nothing a segment reads is another's: regions are a session's own, and a
    # draft's branch in its session's region writes past what the sequence's own rows read.)
    for write in layout.writes:
        arena = pool.arenas[write.arena]
        arena.keys[layer][:, write.slots] = key[0] if write.rows is None else key[0][:, write.rows]
        arena.values[layer][:, write.slots] = value[0] if write.rows is None else value[0][:, write.rows]
    out = torch.empty_like(query)
    gqa = pool.shape.heads != query.shape[1]
    for blocks in layout.blocks:  # a session at a time: its rows attend over its own keys only
        for block in blocks:
            arena = pool.arenas[block.arena]
            out[0, :, block.rows] = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, block.rows], arena.keys[layer][None, :, block.keys],
                arena.values[layer][None, :, block.keys], attn_mask=block.mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2), None  # [1, T, Hq, D], as transformers' attention functions return


def attention_blocks(start: int, stop: int, logits: int) -> list[tuple[int, int]]:
    """A segment's slots start .. stop - 1 as [(first, last), ...], cut wherever a chunked prefill may
    have cut it (``PooledSequence.segment``): at the multiples of ATTENTION_BLOCK up to its rows
    with logits, which are never cut. A decode or verify step is one block (nothing to cut)."""
    cuts = range(start - start % ATTENTION_BLOCK + ATTENTION_BLOCK, stop - max(logits, 1) + 1, ATTENTION_BLOCK)
    edges = [start, *cuts, stop]
    return list(zip(edges, edges[1:], strict=False))


def _attention_blocks(segments: Sequence[Segment], offsets: Sequence[int],
                      masks: Sequence[torch.Tensor | None]) -> list[list[AttentionBlock]]:
    """Each segment's attention calls with their rows and mask rows (a row sees no slot past its own)."""
    blocks = []
    for segment, begin, mask in zip(segments, offsets, masks, strict=False):
        calls, base = [], segment.region.start
        for first, last in attention_blocks(segment.start, segment.start + len(segment.tokens), segment.logits):
            low, high = first - segment.start, last - segment.start
            calls.append(AttentionBlock(slice(begin + low, begin + high), segment.region.arena, slice(base, base + last),
                                        None if mask is None else mask[low:high, :last]))
        blocks.append(calls)
    return blocks


def _kv_writes(segments: Sequence[Segment], offsets: Sequence[int], device: torch.device) -> list[KVWrite]:
    """Where the pass's rows' keys and values go, per arena: a segment's rows to its region's
    slots start .. start + its tokens - 1."""
    by_arena: dict[int, tuple[list[int], list[int]]] = {}
    for segment, begin, end in zip(segments, offsets, offsets[1:], strict=False):
        rows, slots = by_arena.setdefault(segment.region.arena, ([], []))
        rows.extend(range(begin, end))
        first = segment.region.start + segment.start
        slots.extend(range(first, first + end - begin))
    whole = len(by_arena) == 1  # one arena (the usual case): every row, in order, no gather
    return [KVWrite(arena, None if whole else torch.tensor(rows, device=device), torch.tensor(slots, device=device))
            for arena, (rows, slots) in by_arena.items()]


def _gathered_attention(groups: Sequence[GatheredGroup], pool: KVPool, layer: int, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, scaling: float | None) -> tuple[torch.Tensor, None]:
    """The loop's attention in one write per arena and one SDPA call per group: a few large
    operations instead of three small ones per session, which is what a GPU needs (each small
    operation costs a launch) and what a CUDA graph can capture. The price is the gather: every
    segment's keys are copied into a padded batch, which on a CPU costs more than the loop."""
    out = torch.empty_like(query)
    heads = query.shape[1]
    for group in groups:
        arena = pool.arenas[group.arena]
        keys, values = arena.keys[layer], arena.values[layer]  # [Hkv, P, D]
        keys[:, group.slots] = key[0][:, group.rows]
        values[:, group.slots] = value[0][:, group.rows]
    for group in groups:
        arena = pool.arenas[group.arena]
        sessions, q = group.mask.shape[0], group.mask.shape[2]
        queries = query[0][:, group.rows].view(heads, sessions, q, -1).transpose(0, 1)  # [S, Hq, q, D]
        keys = arena.keys[layer][:, group.keys].transpose(0, 1)  # [S, Hkv, L, D]
        values = arena.values[layer][:, group.keys].transpose(0, 1)
        attended = torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=group.mask, scale=scaling, enable_gqa=keys.shape[1] != heads)
        out[0][:, group.rows] = attended.transpose(0, 1).reshape(heads, sessions * q, -1)
    return out.transpose(1, 2), None


def padded_key_index(bases: torch.Tensor, stops: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each of S sessions' keys sit in its arena, padded to ``width``: the arena positions
    base .. base + stop - 1, then base again (harmless to read); and which of the ``width`` columns
    are real. bases, stops: [S] (host). Returns [S, width] long and [S, width] bool."""
    columns = torch.arange(width)
    real = columns[None, :] < stops[:, None]
    return torch.where(real, bases[:, None] + columns[None, :], bases[:, None]), real


def _gathered(segments: Sequence[Segment], offsets: Sequence[int], masks: Sequence[torch.Tensor | None],
              device: torch.device) -> list[GatheredGroup]:  # masks: on the host
    """The pass's segments grouped by arena and row count, with the index tensors every layer uses."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, segment in enumerate(segments):
        by_shape.setdefault((segment.region.arena, len(segment.tokens)), []).append(i)
    groups = []
    for (arena, q), members in by_shape.items():
        bases = torch.tensor([segments[i].region.start for i in members])
        stops = torch.tensor([segments[i].start + q for i in members])
        keys, real = padded_key_index(bases, stops, int(stops.max()))
        mask = real[:, None, None, :].expand(-1, 1, q, -1).clone()  # padding masked off
        rows, slots = [], []
        for n, i in enumerate(members):
            segment = segments[i]
            rows.extend(range(offsets[i], offsets[i] + q))
            slots.extend(range(segment.region.start + segment.start, segment.region.start + segment.start + q))
            if masks[i] is not None:  # a chain's causality or a tree's ancestry within the real columns
                mask[n, 0, :, : masks[i].shape[1]] = masks[i]
        groups.append(GatheredGroup(arena, torch.tensor(rows, device=device), torch.tensor(slots, device=device),
                                    keys.to(device), mask.to(device)))
    return groups


def segment_mask(segment: Segment) -> torch.Tensor | None:
    """Which of the region's slots each of the segment's rows sees: row i of a chain sees slots
    0 .. start + i (bottom-right aligned causality); a tree node sees every slot before the tree,
    its ancestors' and its own."""
    queries = len(segment.tokens)
    keys = segment.start + queries
    if segment.fork is not None:  # the slots before the fork, then the branch's own (causal)
        seen, base = segment.fork
        mask = torch.zeros(queries, keys, dtype=torch.bool)
        mask[:, :seen] = True
        mask[:, base:] = torch.ones(queries, keys - base, dtype=torch.bool).tril(keys - base - queries)
        return mask
    if queries == 1:
        return None
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    if segment.parents is not None:
        nodes = len(segment.parents)
        base = keys - nodes  # the tree's first slot
        tree = torch.zeros(nodes, nodes, dtype=torch.bool)
        for node, parent in enumerate(segment.parents):
            tree[node, node] = True
            if parent >= 0:
                tree[node] |= tree[parent]
        mask[queries - nodes :, base:] = tree
    return mask


AttentionInterface.register(ATTENTION, pooled_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # ordinary forwards build the masks sdpa gets


def use_pooled_attention(model: PreTrainedModel, gathered: bool | None = None) -> PreTrainedModel:
    """Switch ``model`` to the attention that ragged passes need (plain sdpa outside them).

    ``gathered``: attend each pass's sessions in a few batched calls over gathered keys rather
    than one call per session (None: on CUDA, where a small operation costs a kernel launch; on a
    CPU the loop is faster, bench/experiments/batched_pass.py)."""
    model.set_attn_implementation(ATTENTION)
    setattr(model, GATHERED, model.device.type == "cuda" if gathered is None else gathered)
    if model.device.type == "cuda":
        # torch puts cuDNN's attention first for bf16/fp16 on recent GPUs, and cuDNN builds an
        # execution plan per new shape. A decode step attends over one more key than the last, so
        # every step is a new shape. On an H100 (bench/results/20261126-174539-gpu) bf16 engine
        # steps took 29-55 ms against 3-4 ms for the same pass at a repeated shape, and float32
        # (which cuDNN's attention does not take) showed no such cost. Flash and memory-efficient
        # attention plan nothing per shape. The switch is process-wide: a model process runs only
        # these passes.
        torch.backends.cuda.enable_cudnn_sdp(False)
    return model


# A 4-D mask is taken as prepared and passed through untouched: the pass needs none, and building
# transformers' own would cost a [T, T] tensor per pass.
NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


def require_pooled_attention(model: PreTrainedModel) -> None:
    """Any other attention ignores a pass's layout and gives wrong logits without a word."""
    if model.config._attn_implementation != ATTENTION:
        raise ValueError(f"a ragged pass needs the model switched to the {ATTENTION!r} attention: call "
                         f"use_pooled_attention(model) once after loading it")


@torch.inference_mode()
def run_pass(model: PreTrainedModel, pool: KVPool, segments: Sequence[Segment]) -> list[torch.Tensor]:
    """Run every segment's tokens in one forward; each segment's wanted logits, [logits, V] float32."""
    require_pooled_attention(model)
    offsets, positions, wanted = [0], [], []
    for segment in segments:
        if not segment.tokens:
            raise ValueError("a segment needs at least one token")
        if segment.start + len(segment.tokens) > segment.region.capacity:
            raise ValueError(f"the session needs {segment.start + len(segment.tokens)} positions, past the "
                             f"{segment.region.capacity} it reserved")
        positions.extend(segment.positions())
        offsets.append(offsets[-1] + len(segment.tokens))
        wanted.extend(range(offsets[-1] - segment.logits, offsets[-1]))
    device = model.device
    ids = torch.tensor([[t for segment in segments for t in segment.tokens]], device=device)
    hidden = any(segment.aux_layers for segment in segments)
    keep = _padded_rows(wanted, device)
    masks = [segment_mask(s) for s in segments]  # on the host: a gathered pass packs them before one copy
    if getattr(model, GATHERED, False):
        gathered, blocks, writes = _gathered(segments, offsets, masks, device), [], []
    else:
        gathered = None
        blocks = _attention_blocks(segments, offsets, [None if m is None else m.to(device) for m in masks])
        writes = _kv_writes(segments, offsets, device)
    out = model(input_ids=ids, position_ids=torch.tensor([positions], device=device), attention_mask=NO_MASK,
                use_cache=False, logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),
                output_hidden_states=hidden,
                ragged_layout=PassLayout(pool, segments, offsets, blocks, writes, gathered))
    for segment, begin, end in zip(segments, offsets, offsets[1:], strict=False):
        if segment.aux_layers:
            segment.aux = torch.cat([out.hidden_states[layer][0, begin:end] for layer in segment.aux_layers], -1)
    return host_rows(out.logits[0, : len(wanted)], segments)


def host_rows(logits: torch.Tensor, segments: Sequence[Segment]) -> list[torch.Tensor]:
    """Each segment's rows of a pass's wanted logits (``logits``: [rows, V] where the pass ran, the
    segments' rows in order), on the host: [its rows, V] float32; or, for a segment that asked for
    ``ids_only``, their argmax, [its rows] long, taken for the whole pass in one operation. On a GPU
    that is a few hundred ids copied off the device instead of a pass's [rows, V] floats (64 sessions'
    verify steps of 5 rows over a 49k vocabulary: 63 MB in float32)."""
    sizes = [segment.logits for segment in segments]
    if not any(segment.ids_only for segment in segments):
        return list(logits.float().cpu().split(sizes))
    ids = list(logits.argmax(-1).cpu().split(sizes))  # argmax of the model's dtype: the float32 one's
    wanting = [n for n, segment in enumerate(segments) if not segment.ids_only]
    if not wanting:
        return ids
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    rows = [row for n in wanting for row in range(starts[n], starts[n + 1])]
    picked = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)].float().cpu()
    for n, own in zip(wanting, picked.split([sizes[n] for n in wanting]), strict=True):
        ids[n] = own
    return ids


def _padded_rows(wanted: list[int], device: torch.device) -> list[int]:
    """The rows to run the output head over: ``wanted``, padded with repeats of its last row where
    fewer rows would cost more. On CPU, MKL's float32 GEMM runs 2 and 3 rows about as one-row
    products each: SmolLM2-135M's 49,152-row head took 9.6 ms for 1 row, 22.9 for 2, 34.4 for 3 and
    17.2 for 4 (Zen 4, one thread, torch 2.13), so a verify pass of k = 1 or 2, or a batch of 2 or 3
    sessions' draft tokens, pays less as 4 rows. The extra rows are dropped unread."""
    if device.type == "cpu" and len(wanted) in SLOW_GEMM_ROWS:
        return wanted + [wanted[-1]] * (PADDED_GEMM_ROWS - len(wanted))
    return wanted


class PooledSequence:
    """One side (draft or target) of a session: its committed tokens and the pool region whose
    first ``length`` positions hold their keys and values (plus, on a draft, the proposal in flight).

    Both sides commit a verdict the same way: keep the accepted prefix of the proposal, drop the
    rest, append the verifier's own token. Dropping is a length: nothing is copied.
    """

    def __init__(self, region: Region, prompt_ids: Sequence[int], pool: KVPool | None = None) -> None:
        self.region = region
        self.pool = pool  # the region's pool (needed only to commit a token tree: its path moves)
        self.committed = list(prompt_ids)
        self.length = 0  # positions of the region written so far
        self.reused = 0  # of the prompt's, those copied from the prefix cache (workers/prefix_cache.py)

    def segment(self, extra: Sequence[int], logits: int, room: int,
                parents: Sequence[int] | None = None) -> Segment | None:
        """This sequence's part of the next pass: the committed tokens its cache lacks, then
        ``extra`` (a token tree with ``parents``), with logits for the last ``logits`` of them; or,
        when that is more than ``room`` tokens, a chunk of the committed ones (chunked prefill);
        None when nothing fits."""
        pending = self.committed[self.length :] + list(extra)
        if self.length + len(pending) > self.region.capacity:
            raise ValueError(f"the session needs {self.length + len(pending)} positions, past the "
                             f"{self.region.capacity} it reserved")
        if len(pending) <= room:
            return Segment(self.region, self.length, pending, logits, parents)
        end = self.length + min(room, len(pending) - logits)  # the final segment keeps every row with logits
        chunk = end - end % ATTENTION_BLOCK - self.length  # cut where attention's blocks are cut
        return Segment(self.region, self.length, pending[:chunk], 0) if chunk > 0 else None

    def ran(self, segment: Segment) -> None:
        """The pass wrote the segment's tokens."""
        self.length = segment.start + len(segment.tokens)

    def commit(self, proposed: Sequence[int], num_accepted: int, token: int) -> None:
        self.resync(proposed, len(self.committed) + num_accepted, [token])

    def commit_path(self, tree: Sequence[int], path: Sequence[int], token: int) -> None:
        """Commit the accepted path of a token tree the last pass ran, then ``token``. The path's
        nodes move to consecutive slots after the committed tokens (their keys were computed at
        those positions already), a copy of at most the path's length per layer; the rest of the
        tree is dropped by the length."""
        base = len(self.committed)
        if self.length != base + len(tree):
            raise ValueError(f"commit_path after a pass that wrote the tree: length {self.length}, "
                             f"expected {base + len(tree)}")
        moves = [(base + node, base + depth) for depth, node in enumerate(path) if node != depth]
        if moves:
            if self.pool is None:
                raise ValueError("a token tree's path needs the sequence's pool to move")
            self.pool.move(self.region, moves)
        self.length = base + len(path)
        self.committed += [tree[node] for node in path] + [token]

    def adopt(self, fork: int, base: int, written: int) -> None:
        """Take a branch the passes wrote apart (``Segment.fork``): the sequence becomes its first
        ``fork`` committed tokens, with the branch's ``written`` slots from ``base`` moved to follow
        them (a copy of at most k positions per layer). The branch's tokens themselves are the
        caller's (the session's last proposal, which a following ``resync`` keeps or drops)."""
        if (not 1 <= fork <= min(len(self.committed), self.length) or fork + written > base
                or base + written > self.region.capacity):
            raise ValueError(f"a branch forks within the {min(len(self.committed), self.length)} tokens cached: "
                             f"fork {fork}, {written} written from slot {base}")
        if written:
            if self.pool is None:
                raise ValueError("a branch needs the sequence's pool to move")
            self.pool.move(self.region, [(base + j, fork + j) for j in range(written)])
        self.committed = self.committed[:fork]
        self.length = fork + written

    def rewrite(self, proposed: Sequence[int], tokens: Sequence[int]) -> None:
        """Committed becomes ``tokens``; the cache keeps what it holds of their longest prefix shared
        with committed + ``proposed`` (a draft of another tokenizer: the text re-encoded, where only
        the tail differs). At least the first token stays: a session is never empty (where the
        first re-merged, the cache keeps the old one; a draft's context, never its q)."""
        held = self.committed + list(proposed)
        keep = max(1, shared_prefix(held, tokens))
        self.resync(proposed, keep, tokens[keep:])

    def resync(self, proposed: Sequence[int], keep: int, append: Sequence[int]) -> None:
        """Committed becomes the first ``keep`` tokens of committed + proposed, then ``append``.

        ``keep`` may reach into the proposal (a verdict) or back before the last commit (undoing a
        lookahead that assumed a whole proposal accepted); either way the cache only moves its length.
        """
        held = self.committed + list(proposed)
        if not 1 <= keep <= len(held):
            raise ValueError(f"keep must be 1..{len(held)} (the tokens this session holds), got {keep}")
        # With nothing appended, the next pass needs the logits after the last kept token: if the
        # cache holds that token already (a rewind to before the end of a longer proposal), it runs again.
        self.length = min(self.length, keep if append else keep - 1)
        self.committed = held[:keep] + list(append)
