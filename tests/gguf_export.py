"""Writing a zoo model as a GGUF file, as llama.cpp's ``convert_hf_to_gguf.py`` would, for the GGUF tests.

Only what the zoo needs: a Llama-architecture directory (safetensors weights, ``config.json``) and
its byte-level BPE tokenizer (``tokenizer.json``), at f32, f16 or q8_0. The file carries everything
transformers reads back: the hyper-parameters, the weights under llama.cpp's tensor names, and the
tokenizer as GGUF metadata (tokens, token types, merges, special ids), so it loads with no other file.

    path = write_gguf(zoo.target_dir, tmp_path / "target.gguf")
    ModelSpec(str(path))  # wherever a model directory goes

Two llama.cpp conventions transformers undoes on load, and which must therefore be applied here:
Q and K rows are permuted per head (``_llama_permute``), and a tied ``lm_head`` is not written.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file
from transformers import AutoConfig, AutoTokenizer

# How matrices are stored (vectors, the norms, stay float32 as llama.cpp keeps them), and the file type saying so.
DTYPES = {"f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
          "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
          "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}
# llama.cpp's name for GPT-2's split regex, which is the zoo's (ByteLevel(use_regex=True)). transformers
# keeps GPT2Tokenizer's own ByteLevel pre-tokenizer for it: the same split.
PRE_TOKENIZER = "gpt-2"


def write_gguf(model_dir: Path, out: Path, dtype: str = "f32") -> Path:
    """Write the Llama model and tokenizer in ``model_dir`` to ``out`` as GGUF; return ``out``.

    ``dtype`` is the matrices' type: ``f32``, ``f16`` or ``q8_0`` (8-bit blocks of 32, quantised by the
    gguf package as llama.cpp does); vectors (the norms) stay float32, as llama.cpp keeps them.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type != "llama":
        raise ValueError(f"{model_dir} holds a {config.model_type!r} model; this writer knows only llama")
    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    _hyperparameters(writer, config, DTYPES[dtype][1])
    _tokenizer(writer, model_dir, config.vocab_size)
    _tensors(writer, model_dir, config, DTYPES[dtype][0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _hyperparameters(writer: gguf.GGUFWriter, config, file_type: gguf.LlamaFileType) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(config.name_or_path.rstrip("/").rsplit("/", 1)[-1] or "model")
    writer.add_file_type(file_type)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}  # transformers 5; 4.x has config.rope_theta
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope scaling {rope['rope_type']!r} is not written by this test helper")
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _tokenizer(writer: gguf.GGUFWriter, model_dir: Path, vocab_size: int) -> None:
    """The byte-level BPE as llama.cpp writes one (``tokenizer.ggml.model = gpt2``)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    model = spec["model"]
    pre = spec["pre_tokenizer"] or {}
    if model["type"] != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space") or spec["normalizer"] is not None:
        raise ValueError(f"{model_dir}/tokenizer.json is not a plain byte-level BPE; GGUF's gpt2 tokenizer "
                         "cannot express it")
    if len(tokenizer) != vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens and the model {vocab_size}; pad the vocabulary first")
    tokens = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))  # byte-level spelling, as GGUF stores it
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    types = [gguf.TokenType.NORMAL if i not in added
             else gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED
             for i in range(vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # tokenizers writes merges as pairs (>= 0.20) or "a b" strings (older); GGUF wants the strings.
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    for token_id, add in ((tokenizer.bos_token_id, writer.add_bos_token_id),
                          (tokenizer.eos_token_id, writer.add_eos_token_id),
                          (tokenizer.pad_token_id, writer.add_pad_token_id),
                          (tokenizer.unk_token_id, writer.add_unk_token_id)):
        if token_id is not None:
            add(token_id)
    # Whether encode() adds BOS: read off the tokenizer rather than assumed (the zoo's adds none;
    # specserve's encode_prompt adds it), so llama.cpp and transformers encode as the directory does.
    bare = tokenizer.encode("a")
    writer.add_add_bos_token(bool(bare) and bare[0] == tokenizer.bos_token_id)
    writer.add_add_eos_token(bool(bare) and bare[-1] == tokenizer.eos_token_id)


def _tensors(writer: gguf.GGUFWriter, model_dir: Path, config, qtype: gguf.GGMLQuantizationType) -> None:
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    weights = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights |= load_file(shard)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # no output.weight in the file is how GGUF says "tied"
    for hf_name, data in weights.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for tensor {hf_name!r} of {model_dir}")
        if name.endswith("attn_q.weight"):
            data = _llama_permute(data, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            data = _llama_permute(data, config.num_key_value_heads)
        qtype_here = qtype if data.ndim > 1 else gguf.GGMLQuantizationType.F32
        writer.add_tensor(name, gguf.quants.quantize(data, qtype_here), raw_dtype=qtype_here)


def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of Q (``heads`` = query heads) or K (key-value heads) rows:
    each head's two rotary halves interleaved, (x0..x_{d/2-1}, y0..y_{d/2-1}) -> (x0, y0, x1, y1, ..).

    transformers' ``LlamaTensorProcessor._reverse_permute_weights`` is its exact inverse.
    """
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))
