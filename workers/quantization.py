"""Weight-only int8 for the models a server runs: a quarter of float32's weight bytes, computed with
torch's own int8-weight product (``torch._weight_int8pack_mm``: int8 weights, a float scale per
output channel, float activations).

Each linear layer's weight ``W`` [out, in] becomes ``round(W / s)`` in int8 with ``s`` = max |W| of
its output row / 127 (symmetric, per channel, no calibration data), the scales in the model's dtype.
An embedding tied to the output head shares that head's int8 rows and scales, so a tied model stays
tied and small: a vocabulary row is looked up as its int8 values times its scale.

Quantizing a draft changes only what it proposes, never what is served: the target verifies every
token, so the output stays the target's (greedy identical, sampled from the target's distribution),
and only alpha can move. A quantized *target* is a different model from the float one (refused
here until a target can be served so and said to be). The product is row-invariant on a CPU (a
row's result does not depend on the rows beside it: tests/test_quantization.py), as
``RowInvariantLinear`` makes the float layers, so batching does not change a quantized draft's
proposals either.
"""

from __future__ import annotations

import torch
from torch import nn

INT8 = "int8"
QUANTIZATIONS = (INT8,)
_LEVELS = 127  # symmetric: -127..127, so a weight and its negation quantize alike


def check_quantization(kind: str | None) -> None:
    """A ValueError saying what is offered unless ``kind`` is one (or None: float weights)."""
    if kind is not None and kind not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)} (or unset for the model's own "
                         f"weights), got {kind!r}")


def quantized_rows(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] as int8 rows and a scale per row (in ``dtype``): weight ~ rows * scale."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / _LEVELS).clamp(min=torch.finfo(torch.float32).tiny)
    rows = torch.round(weight / scales[:, None]).clamp(-_LEVELS, _LEVELS).to(torch.int8)
    return rows.contiguous(), scales.to(dtype)


class Int8Linear(nn.Module):
    """A linear layer whose weight is int8 rows with a scale each (the bias, if any, stays float)."""

    def __init__(self, rows: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = rows.shape[1], rows.shape[0]
        self.register_buffer("rows", rows)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8Linear:
        rows, scales = quantized_rows(linear.weight, linear.weight.dtype)
        return cls(rows, scales, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch._weight_int8pack_mm(flat, self.rows, self.scales.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class Int8Embedding(nn.Module):
    """An embedding that reads the int8 rows and scales of the output head it is tied to."""

    def __init__(self, head: Int8Linear, padding_idx: int | None) -> None:
        super().__init__()
        self.head = [head]  # a list: not a submodule, so its buffers are counted (and moved) once
        self.padding_idx = padding_idx
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head = self.head[0]
        return head.rows[ids].to(head.scales.dtype) * head.scales[ids].unsqueeze(-1)


def quantize_weights(model: nn.Module, kind: str) -> nn.Module:
    """``model`` with every linear layer's weight quantized to ``kind`` (in place; returned), an
    embedding tied to the output head sharing it. Other weights (norms, untied embeddings) stay."""
    check_quantization(kind)
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied_to = id(embedding.weight) if isinstance(embedding, nn.Embedding) else None
    tied: Int8Linear | None = None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                replaced = Int8Linear.of(child)
                if id(child.weight) == tied_to:
                    tied = replaced
                setattr(parent, name, replaced)
    if tied is not None:
        model.set_input_embeddings(Int8Embedding(tied, embedding.padding_idx))
    return model


def weight_bytes(model: nn.Module) -> int:
    """The bytes of ``model``'s weights as held (parameters and buffers, each tensor once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total
