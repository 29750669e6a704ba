"""Distilling an EAGLE-3 head from a target and a corpus, as speculators trains one.

1. The corpus is cut into sequences; the target runs over them once (batched, no grad) and keeps,
   per position, its aux hidden states and its final hidden state (its logits over the draft
   vocabulary are that times the head rows, computed per batch instead of stored).
2. The draft vocabulary: the most frequent target tokens of the corpus (ties to the lower id).
3. The head starts from the target: its embeddings (shared, frozen, not saved) and the target's
   output-head rows of the draft vocabulary (frozen, as speculators does); the rest is new.
4. Training-time test (TTT): each batch is unrolled ``ttt_steps`` times. Step 0 reads the target's
   features; step s reads, at position i, the ground-truth token x_{i+1+s} and the head's own
   output of step s-1 at i, at position i+s, and attends to the target-fed keys up to i and to its
   own keys of steps 1..s at i (what its cache holds when it drafts s tokens past i). The loss is
   the KL divergence from the target's distribution over the draft vocabulary, summed over steps.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specserve.workers.heads.eagle3 import Eagle3Head, FedHead, HeadConfig

from .presets import HeadTraining, TrainBudget
from .rollout import continue_all
from .training import fit, fixed_length_prompts, random_windows, token_stream

log = logging.getLogger("specserve.heads")

FEATURE_BATCH = 4  # sequences per target pass when computing features
PROMPT_TOKENS = 24  # the start of a document the target continues (as the standalone drafts' distill)
CHAT_EXCERPT_CHARS = 600  # of a document, quoted in an instruction
CHAT_BATCH = 16  # instructions answered per generate call
CHAT_INSTRUCTIONS = ("Explain what this does:\n\n{}", "Summarize this in a few sentences:\n\n{}",
                     "Continue this:\n\n{}", "Improve this and show the result:\n\n{}",
                     "What are the main points of this?\n\n{}")


@dataclass
class Features:
    """The target over the training sequences: tokens [N, n], aux hidden states [N, n, 3Ht] and
    final hidden states [N, n, H]."""

    tokens: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tokens, self.aux, self.last))

    def batches(self, budget: TrainBudget, seed: int):
        """A function of the step: ``budget.batch_size`` sequences drawn at random, as indices."""
        rng = random.Random(seed)
        size = min(budget.batch_size, len(self.tokens))
        return lambda step: torch.tensor(rng.sample(range(len(self.tokens)), size))


def training_sequences(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str],
                       settings: HeadTraining, label: str = "eagle3 head") -> torch.Tensor:
    """[N, sequence_tokens]: the target's own continuations of prompts from the documents (half of
    them greedy, half sampled at temperature 1: what it will be asked to draft), and windows of the
    documents, about ``train_tokens`` in all."""
    n = settings.sequence_tokens
    count = max(2, settings.train_tokens // n)
    generator = torch.Generator().manual_seed(settings.seed)
    stream = token_stream(tokenizer, documents)
    if stream.numel() <= n:
        raise ValueError(f"the corpus has {stream.numel()} tokens: fewer than one sequence of {n}; give more text")
    own = round(count * settings.on_policy_share)
    chat = round(own * settings.chat_share) if getattr(tokenizer, "chat_template", None) else 0
    parts = [random_windows(stream, count - own, n, generator)]
    log.info("%s: %d corpus windows of %d tokens; the target writes %d continuations and answers ~%d chat "
             "instructions (its own text: what it will be asked to draft)", label, count - own, n, own - chat, chat)
    if own - chat:
        prompts = fixed_length_prompts(tokenizer, documents, own - chat, min(PROMPT_TOKENS, n - 1))
        half = len(prompts) // 2
        for temperature, rows in ((0.0, prompts[:half]), (1.0, prompts[half:])):
            if len(rows):
                parts.append(continue_all(target, rows, n - rows.shape[1], temperature, generator))
    if chat:
        parts.append(chat_answers(target, tokenizer, documents, chat, n, generator))
    return torch.cat(parts)


def chat_answers(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[str], count: int,
                 length: int, generator: torch.Generator) -> torch.Tensor:
    """About ``count`` windows of ``length`` tokens of the target answering instructions about
    excerpts of the documents in its chat template (what a chat-served target writes), greedily,
    the conversations packed one after the other."""
    order = torch.randperm(len(documents), generator=generator).tolist()
    prompts = []
    for i in order[: 2 * count]:
        for chars in (CHAT_EXCERPT_CHARS, CHAT_EXCERPT_CHARS // 2, CHAT_EXCERPT_CHARS // 4):  # room to answer
            instruction = CHAT_INSTRUCTIONS[len(prompts) % len(CHAT_INSTRUCTIONS)].format(documents[i][:chars])
            text = tokenizer.apply_chat_template([{"role": "user", "content": instruction}],
                                                 add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(text, add_special_tokens=False)  # the template holds its special tokens
            if len(ids) <= length // 2:
                prompts.append(ids)
                break
    stream: list[int] = []
    pad = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    for start in tqdm(range(0, len(prompts), CHAT_BATCH), desc="chat answers", unit="batch", leave=False, disable=None):
        batch = prompts[start : start + CHAT_BATCH]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])  # left-padded: answers start together
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = target.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                  do_sample=False, max_new_tokens=length - width, pad_token_id=pad).cpu()
        for prompt, row in zip(batch, out[:, width:].tolist(), strict=True):
            answer = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
            stream += prompt + answer
        if len(stream) >= count * length:
            break
    rows = len(stream) // length  # (0 where no instruction fits in half a window: the tensor stays of ids)
    return torch.tensor(stream[: rows * length], dtype=torch.long).view(rows, length)


@torch.inference_mode()
def target_features(target: PreTrainedModel, sequences: torch.Tensor, aux_layers: tuple[int, ...],
                    dtype: torch.dtype) -> Features:
    aux, last = [], []
    for i in tqdm(range(0, len(sequences), FEATURE_BATCH), desc="target features", unit="batch", leave=False,
                  disable=None):
        batch = sequences[i : i + FEATURE_BATCH].to(target.device)
        out = target(input_ids=batch, output_hidden_states=True, logits_to_keep=1)
        if aux_layers:  # none for Medusa heads: they read the last alone
            aux.append(torch.cat([out.hidden_states[layer] for layer in aux_layers], -1).to("cpu", dtype))
        last.append(out.hidden_states[-1].to("cpu", dtype))  # after the final norm: logits = lm_head(last)
    return Features(sequences, torch.cat(aux) if aux else torch.zeros(0, dtype=dtype), torch.cat(last))


def head_from_target(target: PreTrainedModel, config: HeadConfig, vocabulary: torch.Tensor, seed: int) -> Eagle3Head:
    """A new head sharing the target's embeddings, its output rows those of the target's head."""
    torch.manual_seed(seed)
    embeddings = target.get_input_embeddings()
    head = Eagle3Head(config, embeddings)
    init_linear(head)
    head.set_vocabulary(vocabulary)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocabulary])
    head.embed_tokens.requires_grad_(False)
    head.lm_head.requires_grad_(False)
    return head.float()


def init_linear(head: nn.Module) -> None:
    """A new head's linear layers as transformers initialises a Llama's."""
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)  # transformers' initializer_range for Llama


def train_head(head: FedHead, features: Features, target_rows: torch.Tensor, settings: HeadTraining) -> float:
    """TTT on random batches of ``features``; ``target_rows``: the target's output rows of the draft
    vocabulary [Vd, H]. Returns the last smoothed loss."""
    rows = target_rows.float()
    batch = features.batches(settings.budget, settings.seed)

    def loss_at(step: int) -> torch.Tensor:
        picked = batch(step)
        return ttt_loss(head, features.tokens[picked], features.aux[picked].float(),
                        features.last[picked].float() @ rows.T, settings.ttt_steps, agreement=False)[0]

    return fit(head, settings.budget, loss_at, desc="eagle3 head")


def ttt_loss(head: FedHead, tokens: torch.Tensor, aux: torch.Tensor, target_logits: torch.Tensor,
             steps: int, agreement: bool = True) -> tuple[torch.Tensor, list[float]]:
    """(the summed KL loss, each step's top-1 agreement with the target, when asked for) over a batch:
    tokens [B, n], aux [B, n, 3Ht], the target's logits over the draft vocabulary [B, n, Vd]."""
    T = tokens.shape[1] - 1  # rows i = 0..n-2: (x_{i+1}, g_i) predicts x_{i+2}
    feature = head.fuse(aux[:, :-1])  # [B, T, H]
    padded = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], steps)], 1)
    p_all = torch.softmax(target_logits[:, 1:], -1)  # [B, T, Vd]: after x_{i+1}
    # KL(p || q) = sum p log p - sum p log q; the first term is the same at every step: once.
    p_log_p = (p_all * torch.log(p_all.clamp_min(1e-20))).sum(-1)  # [B, T]
    keys: list[tuple[torch.Tensor, torch.Tensor]] = []
    total, agreed = 0.0, []
    for s in range(steps):
        ids = padded[:, 1 + s : 1 + s + T]
        positions = torch.arange(s, s + T)
        x, residual = head.layer.inputs(head.embed_tokens(ids), feature)
        q, k, v = head.layer.self_attn.project(x, positions)  # [B, heads, T, D]
        keys.append((k, v))
        attended = _ttt_attention(q, keys)
        logits, feature = head.output(head.layer.finish(head.layer.self_attn.o_proj(attended), residual))
        valid = T - s  # rows whose label x_{i+2+s} exists
        p = p_all[:, s:]
        log_q = torch.log_softmax(logits[:, :valid].float(), -1)
        kl = p_log_p[:, s:] - (p * log_q).sum(-1)  # [B, valid]
        total = total + kl.mean()
        if agreement:  # an argmax over every row: reporting only, not what training needs
            agreed.append(float((logits[:, :valid].argmax(-1) == p.argmax(-1)).float().mean()))
    return total, agreed


def _ttt_attention(q: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Step s's attention: queries [B, Hq, T, D] over step 0's keys up to their own row, and over
    each later step's key at their own row. Returns [B, T, Hq * D]."""
    k0, v0 = (_repeat(t, q.shape[1]) for t in keys[0])
    scale = q.shape[-1] ** -0.5
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, -math.inf)]  # [B, Hq, T, T]
    diagonal = [(q * _repeat(k, q.shape[1])).sum(-1, keepdim=True) * scale for k, _ in keys[1:]]  # [B, Hq, T, 1]
    weights = torch.softmax(torch.cat(scores + diagonal, -1), -1)
    out = weights[..., :T] @ v0
    for j, (_, v) in enumerate(keys[1:]):
        out = out + weights[..., T + j : T + j + 1] * _repeat(v, q.shape[1])
    return out.transpose(1, 2).flatten(-2)


def _repeat(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads [B, Hkv, T, D] repeated to the query heads (grouped-query attention)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t
