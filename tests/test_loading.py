"""Loading models from a directory, with dtype and device from config, and clear errors."""

import pytest
import torch

from specserve.workers.loading import ModelLoadError, ModelSpec, load_model, load_tokenizer, resolve_device


def test_dtype_comes_from_the_spec(tiny_zoo):
    model = load_model(ModelSpec(str(tiny_zoo.target_dir), dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training


def test_auto_picks_float32_on_cpu_and_cuda_when_present(tiny_zoo):
    model = load_model(ModelSpec(str(tiny_zoo.target_dir)))
    assert model.device == resolve_device("auto")
    if not torch.cuda.is_available():
        assert next(model.parameters()).dtype == torch.float32


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be auto or one of float32, bfloat16, float16, float64, got 'int8'"):
        ModelSpec("somewhere", dtype="int8")


def test_missing_directory_names_the_source(tmp_path):
    with pytest.raises(ModelLoadError, match=f"cannot load model from '{tmp_path}'"):
        load_model(ModelSpec(str(tmp_path)))
    with pytest.raises(ModelLoadError, match="cannot load tokenizer from"):
        load_tokenizer(str(tmp_path))


def test_the_gemv_layout_stores_linear_weights_transposed_keeps_ties_and_the_models_logits():
    """A model process's layout on a CPU (workers/loading.py ``gemv_layout``): each linear weight
    the transpose of a contiguous [in, out] tensor, the output head still the embeddings' tensor,
    the same parameters, and the same logits to a float32 last place (products summed in another order)."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from specserve.workers.loading import gemv_layout

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True)).eval()
    before = copy.deepcopy(model)
    assert gemv_layout(model) is model
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert all(m.weight.stride() == (1, m.weight.shape[0]) for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in before.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before.parameters(), strict=True))
    ids = torch.randint(0, 97, (2, 9))
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, before(ids).logits, rtol=1e-5, atol=1e-6)


def test_the_gemv_layouts_products_give_a_row_the_same_bits_whatever_rows_share_them():
    """One row alone and the same row among 2 to 64 others (workers/loading.py ``RowInvariantLinear``),
    on the shapes of the demo zoo's target: what lets batching leave a session's tokens unchanged."""
    from specserve.workers.loading import RowInvariantLinear, gemv_layout

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a model process runs (the guarantee needs it)
    try:
        for features, out in [(64, 384), (576, 1536), (1536, 576)]:
            layer = gemv_layout(torch.nn.Sequential(torch.nn.Linear(features, out)))[0]
            assert type(layer) is RowInvariantLinear
            rows = torch.randn(65, features)
            with torch.inference_mode():
                alone = layer(rows[:1])
                assert all(torch.equal(layer(rows[:n])[:1], alone) for n in range(2, 66))
                assert torch.equal(layer(rows[0]), alone[0])  # a vector keeps its shape
    finally:
        torch.set_num_threads(threads)



def test_models_loaded_on_several_threads_at_once_are_built_one_at_a_time_and_keep_every_weight(tiny_zoo, monkeypatch):
    """A draft worker loads a canary's version on one thread while it swaps another on the next.
    from_pretrained patches process-wide state while it builds a model (``PreTrainedModel.tie_weights``
    becomes a no-op, restored on exit): two builds at once can restore each other's patch, and every
    later load then leaves a tied output head on the meta device (seen once, in
    tests/test_canary_service.py). So builds overlap never (``_LOADING``), and each model loaded so
    gives the logits of one loaded alone."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from specserve.workers import loading

    building, most = [0], [0]
    count = threading.Lock()
    real = loading.AutoModelForCausalLM

    class Counted:  # the auto class, counting the builds under way at once
        @staticmethod
        def from_pretrained(*args, **kwargs):
            with count:
                building[0] += 1
                most[0] = max(most[0], building[0])
            time.sleep(0.02)  # long enough that unserialised builds overlap
            try:
                return real.from_pretrained(*args, **kwargs)
            finally:
                with count:
                    building[0] -= 1

    ids = torch.tensor([[1, 5, 9, 13]])
    alone = load_model(ModelSpec(str(tiny_zoo.target_dir)))(ids).logits
    monkeypatch.setattr(loading, "AutoModelForCausalLM", Counted)
    with ThreadPoolExecutor(4) as pool:
        models = list(pool.map(lambda _: load_model(ModelSpec(str(tiny_zoo.target_dir))), range(8)))
    assert most[0] == 1
    for model in models:
        assert not any(tensor.is_meta for tensor in model.state_dict().values())
        assert torch.equal(model(ids).logits, alone)
