"""Weight-only int8 drafts (workers/quantization.py): a quarter of the weight bytes, products close to
the float layer's and row-invariant, and the served output still the target's alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_model
from specserve.workers.quantization import Int8Embedding, Int8Linear, quantize_weights, quantized_rows, weight_bytes
from specserve.workers.request import GenerationParams


def test_an_int8_linear_is_the_float_one_within_its_rounding_and_row_invariant():
    torch.manual_seed(0)
    linear = nn.Linear(128, 352, bias=True)
    quantized = Int8Linear.of(linear)
    x = torch.randn(3, 70, 128)
    rows, scales = quantized_rows(linear.weight, torch.float32)
    assert rows.dtype == torch.int8 and rows.abs().max() <= 127
    # Each weight is off by at most half a step of its row's scale, so a product by at most that
    # times the row's |x| sum.
    bound = (0.5 * scales[None, None, :] * x.abs().sum(-1, keepdim=True)) + 1e-4
    with torch.no_grad():
        assert ((quantized(x) - linear(x)).abs() <= bound).all()
        whole = quantized(x.reshape(-1, 128))
        for start, count in ((0, 1), (5, 2), (9, 3), (40, 17)):  # a row comes out the same beside any rows
            assert torch.equal(quantized(x.reshape(-1, 128)[start:start + count]), whole[start:start + count])


def test_a_tied_embedding_shares_the_heads_int8_rows():
    torch.manual_seed(0)
    model = nn.Module()
    model.embed, model.head = nn.Embedding(50, 16), nn.Linear(16, 50, bias=False)
    model.head.weight = model.embed.weight
    model.get_input_embeddings = lambda: model.embed
    model.set_input_embeddings = lambda e: setattr(model, "embed", e)
    before = model.embed.weight.detach().clone()
    quantize_weights(model, "int8")
    assert isinstance(model.embed, Int8Embedding) and model.embed.head[0] is model.head
    ids = torch.tensor([[0, 7, 49]])
    assert torch.allclose(model.embed(ids), before[ids], atol=float(model.head.scales.max()) / 2 + 1e-6)
    assert weight_bytes(model) == 50 * 16 + 50 * 4  # the int8 rows and their scales, once


def test_an_int8_draft_holds_a_quarter_of_the_bytes_and_the_output_stays_the_targets(tiny_zoo):
    source = str(tiny_zoo.draft_dir("sql"))
    float_bytes = weight_bytes(load_model(ModelSpec(source)))
    int8_bytes = weight_bytes(load_model(ModelSpec(source, quantize="int8")))
    assert float_bytes / int8_bytes >= 3.5, (float_bytes, int8_bytes)
    target = ModelSpec(str(tiny_zoo.target_dir))
    engine = SpecEngine.load(target, {"sql": ModelSpec(source), "sql-int8": ModelSpec(source, quantize="int8")})
    prompts = tiny_zoo.prompts("sql")[:3]
    accepted = {}
    for prompt in prompts:
        alone = engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete().token_ids
        for draft in ("sql", "sql-int8"):
            done = engine.generate(prompt, GenerationParams(max_tokens=40, k=4), draft=draft).complete()
            assert done.token_ids == alone, draft  # quantizing a draft changes what it proposes, not the output
            accepted[draft] = accepted.get(draft, 0) + done.stats.accepted
    assert accepted["sql-int8"] > 0, accepted  # it still drafts what the target says


def test_an_unknown_quantization_is_refused_with_what_there_is():
    with pytest.raises(ValueError, match="quantize must be one of int8 .* got 'int4'"):
        ModelSpec("anywhere", quantize="int4")


def test_models_quantize_names_draft_models_only_and_the_pool_loads_them_so(tiny_zoo):
    from specserve.cluster.config import ServiceConfig
    from specserve.cluster.models import resolve_models

    def resolved(quantize: dict):
        config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root), "quantize": quantize}})
        return resolve_models(config.models, config.router)

    models = resolved({"sql": "int8"})
    assert models.draft_spec("sql", 1).quantize == "int8" and models.draft_spec("code", 1).quantize is None
    with pytest.raises(ValueError, match="models.quantize names 'nope', which is no draft here; the drafts are code"):
        resolved({"nope": "int8"})
    with pytest.raises(ValueError, match="'eagle3', which is a head of the target's"):
        resolved({"eagle3": "int8"})
    with pytest.raises(ValueError, match="models.quantize.sql: quantize must be one of int8"):
        resolved({"sql": "int4"})


def test_serve_quantize_is_models_quantize():
    from specserve.cluster.cli import build_parser
    from specserve.cluster.commands.serve import _serve_overrides

    args = build_parser().parse_args(["serve", "--quantize", "sql=int8", "--quantize", "code=int8"])
    assert _serve_overrides(args)["models"]["quantize"] == {"sql": "int8", "code": "int8"}
    with pytest.raises(ValueError, match="--quantize 'sql': expected DRAFT=int8"):
        _serve_overrides(build_parser().parse_args(["serve", "--quantize", "sql"]))


def test_the_service_serves_an_int8_draft_and_its_output_is_the_targets(service, client, tiny_zoo):
    """The session's service serves the sql draft again as QUANTIZED_DRAFT with int8 weights
    (models.quantize), on its draft workers: greedy through it is target-only's, tokens accepted."""
    from specserve.proto.v1 import specserve_pb2 as pb

    from conftest import QUANTIZED_DRAFT, QUANTIZED_TASK

    accepted = 0
    for prompt in tiny_zoo.prompts("sql")[:3]:
        plain = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, speculation=pb.SPECULATION_OFF))
        reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, task=QUANTIZED_TASK, k=4,
                                                   speculation=pb.SPECULATION_ON), timeout=120)
        assert list(reply.token_ids) == list(plain.token_ids), reply.stats
        assert reply.stats.draft == QUANTIZED_DRAFT and reply.stats.route != "lost", reply.stats
        accepted += reply.stats.accepted_tokens
    assert accepted > 0
