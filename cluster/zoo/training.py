"""Training the zoo's models: construction, token streams and one optimiser loop for every stage.

Pretraining the target and distilling a draft differ only in their loss, so both run through
``fit``. Randomness comes from explicit generators seeded by the caller, and budgets are step
counts, so a stage is deterministic for its seed (on the same machine and thread count).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from .presets import ModelShape, TrainBudget

log = logging.getLogger("specserve.zoo")

WARMUP_FRACTION = 0.05  # of the steps; linear warm-up, then cosine decay to MIN_LR_FRACTION
MIN_LR_FRACTION = 0.1
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 arithmetic
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
LOG_EVERY_FRACTION = 0.1  # progress lines in logs (progress bars only show on a terminal)


def new_model(
    shape: ModelShape, tokenizer: PreTrainedTokenizerBase, context_window: int, seed: int,
    vocab_size: int | None = None,
) -> LlamaForCausalLM:
    """A freshly initialised Llama-architecture causal LM speaking ``tokenizer``'s vocabulary.

    ``vocab_size`` defaults to the tokenizer's; a draft for an existing target takes the target's,
    which is often padded beyond the tokenizer (the draft's logits must index the same ids).
    """
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=context_window,
        tie_word_embeddings=shape.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)  # HF initialises weights from the global generator; nothing else is running
    return LlamaForCausalLM(config)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_stream(tokenizer: PreTrainedTokenizerBase, documents: Sequence[str]) -> torch.Tensor:
    """All documents as one 1-D stream, each as BOS + text + EOS, as prompts are encoded at serving."""
    ids: list[int] = []
    for doc in documents:
        ids += [*special(tokenizer.bos_token_id), *tokenizer.encode(doc, add_special_tokens=False),
                *special(tokenizer.eos_token_id)]
    return torch.tensor(ids, dtype=torch.long)


def fixed_length_prompts(
    tokenizer: PreTrainedTokenizerBase, documents: Iterable[str], count: int, length: int
) -> torch.Tensor:
    """BOS and the start of the first ``count`` documents with at least ``length`` tokens: [n, length].

    One length for every row lets a batch run without padding (see rollout.py).
    """
    prompts = []
    for doc in documents:
        # 20 characters per token is far more than BPE needs: no need to encode whole documents.
        ids = [*special(tokenizer.bos_token_id), *tokenizer.encode(doc[: 20 * length], add_special_tokens=False)]
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == count:
            break
    if not prompts:
        raise ValueError(f"no document is long enough for a {length}-token prompt")
    return torch.tensor(prompts)


def special(token_id: int | None) -> list[int]:
    """[token_id], or [] for a tokenizer without that special token (many have no BOS)."""
    return [] if token_id is None else [token_id]


def random_windows(stream: torch.Tensor, count: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``seq_len`` tokens at random offsets of ``stream``: [count, seq_len]."""
    if stream.numel() <= seq_len:
        raise ValueError(f"a stream of {stream.numel()} tokens is too short for windows of {seq_len}")
    starts = torch.randint(0, stream.numel() - seq_len, (count,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def fit(
    model: torch.nn.Module, budget: TrainBudget, loss_at: Callable[[int], torch.Tensor], desc: str
) -> float:
    """Minimise ``loss_at(step)`` for ``budget.steps`` AdamW steps; return the last smoothed loss.

    bf16 autocast where the hardware has bf16 arithmetic (see ``bf16_pays``); the master weights
    and the optimiser stay float32.
    """
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=budget.learning_rate, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: _lr_factor(step, budget.steps))
    device_type = next(model.parameters()).device.type
    autocast = bf16_pays(device_type)
    smoothed = math.nan
    log_every, started = max(1, int(budget.steps * LOG_EVERY_FRACTION)), time.perf_counter()
    with tqdm(range(budget.steps), desc=desc, unit="step", leave=False, disable=None) as bar:
        for step in bar:
            with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
                loss = loss_at(step)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimiser.step()
            schedule.step()
            optimiser.zero_grad(set_to_none=True)
            value = float(loss.detach())
            smoothed = value if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * value
            bar.set_postfix(loss=f"{smoothed:.3f}")
            if (step + 1) % log_every == 0:
                log.info("%s: step %d/%d, loss %.3f, %.0f s", desc, step + 1, budget.steps, smoothed,
                         time.perf_counter() - started)
    model.eval()
    return smoothed


def pretrain(
    model: LlamaForCausalLM, stream: torch.Tensor, budget: TrainBudget, seq_len: int, seed: int
) -> float:
    """Next-token training on random windows of ``stream``."""
    generator = torch.Generator().manual_seed(seed)

    def loss_at(step: int) -> torch.Tensor:
        batch = random_windows(stream, budget.batch_size, seq_len, generator)  # [B, T]
        return model(input_ids=batch, labels=batch).loss

    return fit(model, budget, loss_at, desc="target")


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, int(total * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


def bf16_pays(device_type: str) -> bool:
    """Whether bf16 autocast speeds training up on this device. On GPUs it does; on a CPU only with
    bf16 instructions: with them it roughly doubled throughput (4,569 vs 2,087 tokens/s, an 8.7M
    model), without them (AVX2 only) it emulated bf16 and ran 4.5x slower than float32 (35 vs 7.9 s
    a step, the demo target)."""
    if device_type != "cpu":
        return device_type == "cuda"
    try:
        with open("/proc/cpuinfo") as info:
            flags = info.read()
    except OSError:  # not Linux: no way to tell, and float32 is never the slow choice
        return False
    return any(flag in flags.split() for flag in CPU_BF16_FLAGS)

