"""Loading Hugging Face causal LMs and their tokenizers onto the configured device.

Any causal LM directory or hub id works; on this project's machines nothing can be downloaded, so
directories (the model zoo, or a mounted volume in production) are the normal case. A ``.gguf``
file works too (llama.cpp's format): transformers reads its tokenizer and dequantises its weights
to the model's dtype, so a quantised file serves at full precision (and full size) here; it needs
the ``gguf`` package (``pip install gguf``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
import torch
from tokenizers import Tokenizer
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel,
                          PreTrainedTokenizerBase, PreTrainedTokenizerFast)

from .load_errors import ModelLoadError
from .quantization import check_quantization, quantize_weights, weight_bytes
from .vocabulary import prune_head, read_vocabulary

log = logging.getLogger("specserve.workers")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how it runs."""

    source: str  # a directory with config.json, a .gguf file, or a hub id
    dtype: str = "auto"  # auto = bfloat16 on CUDA, float32 on CPU (CPU bf16 matmuls are slower per token)
    device: str = "auto"  # auto = cuda when present, else cpu
    threads: int | None = None  # torch intra-op threads for this process; None leaves torch's default
    quantize: str | None = None  # weight-only quantization (workers/quantization.py); None: as stored

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_quantization(self.quantize)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def load_model(spec: ModelSpec) -> PreTrainedModel:
    """Load a causal LM for inference (eval mode, no grad bookkeeping)."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = resolve_device(spec.device)
    model = _from_pretrained(AutoModelForCausalLM, spec.source, "model", dtype=resolve_dtype(spec.dtype, device))
    if not is_gguf(spec.source) and (kept := read_vocabulary(spec.source)) is not None:
        model = prune_head(model, kept)  # a draft distilled with a reduced vocabulary (workers/vocabulary.py)
    if empty := [name for name, tensor in model.state_dict().items() if tensor.is_meta]:
        raise ModelLoadError(f"cannot load model from {spec.source!r}: {len(empty)} weights were left unloaded "
                             f"({', '.join(empty[:3])}{', ...' if len(empty) > 3 else ''}); is the checkpoint "
                             f"complete?")
    model = model.to(device).eval()
    if spec.quantize is None:
        return model
    stored = weight_bytes(model)
    model = quantize_weights(model, spec.quantize)
    log.info("%s: %s weights, %.2f MiB (%.2f MiB as stored)", spec.source, spec.quantize, weight_bytes(model) / 2**20,
             stored / 2**20)
    return model


def gemv_layout(model: torch.nn.Module) -> torch.nn.Module:
    """On a CPU, store each linear layer's weight [out, in] as the transpose of a contiguous [in, out]
    tensor: the same values, read in the order a one-row product streams fastest. A decode step is
    one row per session through every weight, read from memory: on the 2-core host (one thread,
    float32, MKL), SmolLM2-135M's 49,152 x 576 output head took 10.1 ms as loaded and 5.3 ms so
    stored, its 30 layers' products 36.4 against 30.4 ms, and a step with 5 or 64 rows the same
    either way (bench/experiments/single_stream.py measures the whole step). The layers become
    ``RowInvariantLinear``: a row's product never depends on the rows beside it. Tied weights stay
    tied. A model served so must not be saved as it is (safetensors wants contiguous tensors); no
    server saves one."""
    if next(model.parameters()).device.type != "cpu":
        return model  # cuBLAS reads either layout at full speed
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = RowInvariantLinear
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    stored: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():  # an embedding tied to the output head takes the same new tensor
        for name, weight in list(module.named_parameters(recurse=False)):
            if id(weight) in linear:
                if id(weight) not in stored:
                    stored[id(weight)] = torch.nn.Parameter(weight.detach().t().contiguous().t(),
                                                            requires_grad=weight.requires_grad)
                setattr(module, name, stored[id(weight)])
    return model


# Rows from which MKL runs one matrix-matrix kernel whatever their number (one thread): 2 on the
# Intel hosts this was first measured on; 4 on an AMD EPYC host (2026-11-28: products of 2 and 3
# rows rounded like one row, not like 4 to 300), where padding a one-row product to 4 costs 3x on
# SmolLM2's output head (19.6 -> 65 ms) and keeps a session's tokens whatever it is batched with.
MATRIX_ROWS = 4


class RowInvariantLinear(torch.nn.Linear):
    """A linear layer whose every row comes out the same whatever rows share its product.

    Batching must not change a session's tokens (greedy, or sampled from its own generator), so a
    row's logits must not depend on how many rows a pass holds. On a CPU, one thread, the gemv
    layout: MKL computes a product of few rows with kernels rounded differently from the
    matrix-matrix kernel that every product of ``MATRIX_ROWS`` rows or more runs with the same
    rounding per row (bit for bit, to 300 rows, measured on SmolLM2-135M's shapes). So a product of
    fewer rows runs padded to that many: on Intel (2 rows) +20-25% on a one-row product (the output
    head 7.6 -> 9.3 ms), paid only by a pass of one row (a lone session decoding without a draft).
    Without it, a top-p nucleus edge within 2e-7 of p flipped a sampled session's tokens when it
    shared passes (tests/test_batching.py). With several torch threads MKL splits some shapes
    differently by row count, and the guarantee needs one thread per model process (the default).
    """

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        # Counted, not reshaped: this runs on every linear of every pass, and a reshape costs ~10x a
        # division there (3.8 vs 0.4 us; ~0.7 ms a pass on SmolLM2).
        count = rows.numel() // rows.shape[-1]
        if not 0 < count < MATRIX_ROWS:
            return super().forward(rows)
        flat = rows.reshape(count, rows.shape[-1])
        padded = torch.cat([flat, flat[:1].expand(MATRIX_ROWS - count, -1)])
        out = torch.nn.functional.linear(padded, self.weight, self.bias)[:count]
        return out.reshape(*rows.shape[:-1], self.out_features)


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    tokenizer = _from_pretrained(AutoTokenizer, source, "tokenizer")
    return _without_invented_tokens(tokenizer, load_config(source).vocab_size) if is_gguf(source) else tokenizer


def load_config(source: str) -> PretrainedConfig:
    return _from_pretrained(AutoConfig, source, "model config")


def _without_invented_tokens(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> PreTrainedTokenizerBase:
    """A GGUF file's tokenizer with only the file's tokens: none at an id the model has no embedding for.

    transformers (5.x) builds a byte-level ("gpt2") GGUF tokenizer through GPT2Tokenizer, whose default
    special token ``<|endoftext|>`` it adds as one more token when the file has none (Llama 3's files,
    the zoo's): a prompt holding that text would index past the embeddings, and the vocabulary would
    differ from the same model's directory, so every draft would be refused.
    """
    if len(tokenizer) <= vocab_size:
        return tokenizer
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state["added_tokens"] = [token for token in state["added_tokens"] if token["id"] < vocab_size]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)),
                                   **tokenizer.special_tokens_map)


# One load at a time in a process. transformers' from_pretrained patches process-wide state while it
# builds a model (the default dtype, weight tying and init functions swapped for no-ops, restored on
# exit): two loads on two threads (a draft worker takes a canary's version while it swaps another)
# can restore each other's patches, and a later load then leaves tied weights on the meta device
# ("Cannot copy out of meta tensor" at .to(device); seen once in tests/test_canary_service.py).
_LOADING = threading.RLock()


def _from_pretrained(auto, source: str, what: str, **kwargs):
    """``auto.from_pretrained`` on a directory, hub id or GGUF file, its failures as ModelLoadError."""
    where, extra = _where(source)
    _check_local(source, what)
    try:
        with _LOADING:
            return auto.from_pretrained(where, **extra, **kwargs, local_files_only=_is_local(source))
    except (OSError, ValueError, ImportError, StrictDataclassError) as exc:  # the last: a config.json transformers finds invalid
        raise ModelLoadError(f"cannot load {what} from {source!r}: {exc}") from exc


def is_gguf(source: str) -> bool:
    return source.lower().endswith(".gguf")


def _where(source: str) -> tuple[str, dict]:
    """from_pretrained's directory and arguments: a GGUF file is named inside its directory."""
    if is_gguf(source):
        path = Path(os.path.expanduser(source))
        return str(path.parent), {"gguf_file": path.name}
    return source, {}


def _check_local(source: str, what: str) -> None:
    """A path that is no model says so in one line (transformers' own messages run to paragraphs)."""
    path = Path(os.path.expanduser(source))
    looks_like_a_path = source.startswith(("/", ".", "~")) or is_gguf(source)
    if looks_like_a_path and not path.exists():
        raise ModelLoadError(f"cannot load {what} from {source!r}: it does not exist; give a model directory, a "
                             f".gguf file or a hub id")
    # A tokenizer may live in a directory of its own (the zoo's), without the model's config.
    needs = ("config.json", "tokenizer.json", "tokenizer_config.json") if what == "tokenizer" else ("config.json",)
    if path.is_dir() and not any((path / name).is_file() for name in needs):
        raise ModelLoadError(f"cannot load {what} from {source!r}: it is not a model directory, it has no "
                             f"{' or '.join(needs)} (a Hugging Face model directory holds config.json, the weights "
                             f"and the tokenizer files; or give a .gguf file)")


def _is_local(source: str) -> bool:
    # A path that exists never needs the hub; asking it anyway would hang on machines with no network.
    return Path(os.path.expanduser(source)).exists()
