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
