"""MTP modules (workers/heads/mtp.py): `specserve distill --method mtp` writes the tiny zoo's target
again carrying one (DeepSeek-V3's layout), which loads from its own keys; one specserve cannot run
is refused in one line; it drafts losslessly in
process and through the service (from the draft workers, fed the target's last hidden states, or
on the target replica after each verify pass: models.on_replica), and a target that carries one
serves it as draft "mtp" with no flag."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specserve.cluster.config import ServiceConfig
from specserve.cluster.models import resolve_models
from specserve.workers.engine import SpecEngine
from specserve.workers.heads.checkpoint import CONFIG, FACTS, HeadFormatError
from specserve.workers.heads.format import is_head, load_head_of, read_config
from specserve.workers.heads.mtp import MTP, MTP_WEIGHTS, is_mtp
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer
from specserve.workers.request import GenerationParams

from types import SimpleNamespace

from specserve.workers import proposing
from specserve.workers.sampling import SamplingParams
from specserve.workers.heads.fed_guess import FedGuessBatch, FedGuesser
from specserve.workers.heads.proposer import HeadState
from specserve.workers.seeds import DraftDraws

from conftest import MEDUSA_TASKS, MTP_HERE, MTP_HERE_TASK, MTP_TASK


@pytest.fixture(scope="module")
def target(tiny_zoo):
    return load_model(ModelSpec(str(tiny_zoo.target_dir)))


def test_distill_writes_the_target_carrying_a_module_in_deepseeks_layout(mtp_target, tiny_zoo, target):
    where, facts = mtp_target
    assert is_mtp(where) and is_head(where) and not is_mtp(tiny_zoo.target_dir)
    layers = target.config.num_hidden_layers
    assert json.loads((where / CONFIG).read_text())["num_nextn_predict_layers"] == 1
    keys = set(load_file(str(where / MTP_WEIGHTS)))
    assert {f"model.layers.{layers}.{name}.weight" for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm",
                                                                "shared_head.head", "embed_tokens")} <= keys
    assert facts["greedy_identical"] and facts["method"] == "mtp" and json.loads((where / FACTS).read_text())
    # Before training it guesses nothing; 80 steps on the tiny target's text: 0.9+ when this was written.
    assert facts["held_out_alpha"] > 0.5, facts
    # The model itself is the target's: transformers loads it without the module's file.
    again = load_model(ModelSpec(str(where)))
    ids = torch.tensor([load_tokenizer(str(where)).encode(tiny_zoo.prompts("sql")[0])])
    with torch.inference_mode():
        assert torch.equal(again(input_ids=ids).logits, target(input_ids=ids).logits)


def test_greedy_output_drafting_with_the_module_is_the_targets_alone(tiny_zoo, mtp_target):
    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {MTP: ModelSpec(str(mtp_target[0]))})
    accepted = 0
    for task in MEDUSA_TASKS:
        for prompt in tiny_zoo.prompts(task)[:3]:
            plain = engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
            for k in (1, 3, 5):
                drafted = engine.generate(prompt, GenerationParams(max_tokens=40, k=k), draft=MTP).complete()
                assert drafted.token_ids == plain.token_ids, (task, k)
                accepted += drafted.stats.accepted
    assert accepted > 0


@pytest.mark.parametrize(("change", "message"), [
    ({"config": {"model_type": "deepseek_v3"}}, "Llama-shaped layers"),
    ({"config": {"num_nextn_predict_layers": 0, "mtp_num_hidden_layers": 1}}, "Qwen3-Next's"),
    ({"config": {"num_hidden_layers": 9}}, "for another model"),
    ({"config": {"hidden_size": 7}}, "does not give an MTP module.s shape"),
    ({"extra": "self_attn.q_a_proj.weight"}, "which a Llama-shaped layer does not"),
    ({"drop": "eh_proj.weight"}, "missing from its checkpoint"),
])
def test_a_module_specserve_cannot_run_is_refused_in_one_line(mtp_target, target, tmp_path, change, message):
    where, _ = mtp_target
    copy = shutil.copytree(where, tmp_path / "copy")
    layers = target.config.num_hidden_layers
    config = json.loads((copy / CONFIG).read_text())
    (copy / CONFIG).write_text(json.dumps(config | change.get("config", {})))
    weights = load_file(str(copy / MTP_WEIGHTS))
    if "extra" in change:
        weights[f"model.layers.{layers}.{change['extra']}"] = torch.zeros(2, 2)
    if "drop" in change:
        del weights[f"model.layers.{layers}.{change['drop']}"]
    save_file(weights, str(copy / MTP_WEIGHTS))
    with pytest.raises(HeadFormatError, match=message):
        read_config(copy, target.config)
        load_head_of(copy, target)


def test_a_target_that_carries_a_module_drafts_with_it_unless_a_table_leaves_it_out(mtp_target, tiny_zoo, tmp_path):
    where = str(mtp_target[0])
    models = resolve_models(*_parts({"models": {"zoo": None, "target": where}}))
    assert models.drafts == {MTP: where} and models.tasks["general"][0] == MTP  # the default task
    assert models.priors["general"][MTP] == mtp_target[1]["held_out_alpha"]  # what distill measured
    sql = str(tiny_zoo.draft_dir("sql"))  # explicit drafts and no table: a task each, the module after
    models = resolve_models(*_parts({"models": {"zoo": None, "target": where, "drafts": {"sql": sql}},
                                     "router": {"default_task": "sql"}}))
    assert models.tasks["sql"][:2] == ("sql", MTP)
    # One specserve cannot run is left out, said in the log: the target serves as it did.
    other = shutil.copytree(where, tmp_path / "deepseek")
    config = json.loads((other / CONFIG).read_text())
    (other / CONFIG).write_text(json.dumps(config | {"model_type": "deepseek_v3"}))
    assert MTP not in resolve_models(*_parts({"models": {"zoo": None, "target": str(other)}})).drafts
    listed = {"tasks": {"general": ["ngram"]}}
    assert MTP not in resolve_models(*_parts({"models": {"zoo": None, "target": where}, "router": listed})).drafts
    listed = {"tasks": {"general": ["ngram", MTP]}}
    assert resolve_models(*_parts({"models": {"zoo": None, "target": where}, "router": listed})).tasks["general"][:2] == ("ngram", MTP)


def _parts(doc: dict):
    config = ServiceConfig.model_validate(doc)
    return config.models, config.router


def test_distill_says_which_flags_shape_an_eagle3_head_not_a_module(tiny_zoo, medusa_heads, tmp_path, capsys):
    from specserve.cluster.cli import main

    corpus = [str(medusa_heads[0].parent / f"{task}.txt") for task in MEDUSA_TASKS]
    assert main(["distill", "--method", "mtp", "--target", str(tiny_zoo.target_dir), "--corpus", *corpus,
                 "--out", str(tmp_path / "m"), "--draft-vocab", "256"]) == 2
    assert "an MTP module reads the target's last hidden state" in capsys.readouterr().err
    assert main(["distill", "--method", "mtp", "--target", str(tiny_zoo.target_dir), "--corpus", *corpus,
                 "--out", str(tiny_zoo.target_dir)]) == 2
    assert "the target's own directory" in capsys.readouterr().err


def test_through_the_service_the_draft_workers_draft_with_the_module_and_greedy_output_is_the_targets(
        service, client, tiny_zoo):
    assert greedy_through_the_service(client, tiny_zoo, MTP_TASK, MTP) > 0


def greedy_through_the_service(client, tiny_zoo, task: str, draft: str, then=lambda prompt: None) -> int:
    """Greedy requests of ``task`` (served by ``draft`` alone) over two prompts of each of Medusa's
    tasks, each the target's alone; ``then(prompt)`` after each. Returns the tokens accepted."""
    from specserve.proto.v1 import specserve_pb2 as pb

    accepted = 0
    for text_task in MEDUSA_TASKS:
        for prompt in tiny_zoo.prompts(text_task)[:2]:
            plain = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, speculation=pb.SPECULATION_OFF))
            reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, task=task, k=3,
                                                       speculation=pb.SPECULATION_ON), timeout=120)
            assert list(reply.token_ids) == list(plain.token_ids), (text_task, reply.stats)
            assert reply.stats.draft == draft and reply.stats.route != "lost", reply.stats
            accepted += reply.stats.accepted_tokens
            then(prompt)
    return accepted


def test_on_the_verifier_the_module_proposes_what_it_proposes_as_a_draft_of_its_own(tiny_zoo, mtp_target):
    """Drafting after each verify pass (heads/fed_guess.py: as a target replica serving it does)
    proposes token for token and q for q what the module drafts before it: greedy and seeded sampled
    requests give the same tokens, accept as many and take as many target passes, at every k."""
    alone = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {MTP: ModelSpec(str(mtp_target[0]))})
    after = SpecEngine(alone.target, alone.tokenizer, {}, heads=alone.heads, on_verifier=(MTP,))
    sampled = SamplingParams(temperature=1.0, top_p=0.9)
    for task in MEDUSA_TASKS:
        for prompt in tiny_zoo.prompts(task)[:2]:
            for k, sampling in ((1, SamplingParams()), (3, SamplingParams()), (4, sampled), (2, sampled)):
                params = GenerationParams(max_tokens=32, k=k, sampling=sampling, seed=11)
                a, b = (engine.generate(prompt, params, draft=MTP).complete() for engine in (alone, after))
                assert (b.token_ids, b.stats.accepted, b.stats.proposed, b.stats.target_passes) == (
                    a.token_ids, a.stats.accepted, a.stats.proposed, a.stats.target_passes), (task, k)


def test_through_the_service_the_target_replica_drafts_with_the_module_and_output_is_as_in_process(
        service, client, tiny_zoo, mtp_target):
    """MTP_HERE (models.on_replica) drafts on the target replica, its proposal in each verify reply:
    greedy output is the target's alone, and a seeded sampled request gives the tokens it gives in
    process, drafting as a draft of its own (the same proposals: the test above). Its prompt is one
    no request sent before: a prompt prefix from the prefix cache has no hidden states in the
    session, and the module starts after it (in process it reads them all)."""
    from specserve.proto.v1 import specserve_pb2 as pb

    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {MTP_HERE: ModelSpec(str(mtp_target[0]))})

    def seeded_as_in_process(prompt: str) -> None:
        fresh = f"{MTP_HERE_TASK} {len(prompt)}. {prompt}"
        seeded = client.generate(pb.GenerateRequest(prompt=fresh, max_tokens=24, task=MTP_HERE_TASK, k=2,
                                                    temperature=1.0, top_p=0.9, seed=7,
                                                    speculation=pb.SPECULATION_ON), timeout=120)
        local = engine.generate(fresh, GenerationParams(max_tokens=24, k=2, seed=7,
                                                        sampling=SamplingParams(temperature=1.0, top_p=0.9)),
                                draft=MTP_HERE).complete()
        assert seeded.stats.cached_prompt_tokens == 0, seeded.stats
        assert list(seeded.token_ids) == local.token_ids, (prompt, seeded.stats)
        assert seeded.stats.accepted_tokens == local.stats.accepted, (seeded.stats, local.stats)

    assert greedy_through_the_service(client, tiny_zoo, MTP_HERE_TASK, MTP_HERE, seeded_as_in_process) > 0


def test_on_replica_names_heads_fed_by_hidden_states_only(tiny_zoo, mtp_target):
    for named, why in ((["nowhere"], "not among the drafts served"), (["sql"], "no heads fed by .* drafts: .*mod")):
        config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root),
                                                          "drafts": {"mod": str(mtp_target[0])},
                                                          "on_replica": named}})
        with pytest.raises(ValueError, match=rf"models.on_replica names .*{why}"):
            resolve_models(config.models, config.router)
    config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root), "drafts": {"mod": str(mtp_target[0])},
                                                      "on_replica": ["mod"]}})
    models = resolve_models(config.models, config.router)
    assert "mod" in models.on_verifier and "mod" not in models.medusa


def test_serve_on_replica_is_models_on_replica():
    from specserve.cluster.cli import build_parser
    from specserve.cluster.commands.serve import _serve_overrides

    args = build_parser().parse_args(["serve", "--target", "DIR", "--on-replica", "mtp,head"])
    assert _serve_overrides(args)["models"]["on_replica"] == ["mtp", "head"]


class BrokenDraws(DraftDraws):
    def uniform(self, position: int) -> float:
        raise RuntimeError("no uniform here")


def owing_session(batch: FedGuessBatch, width: int, draws: DraftDraws, prompt: int = 4) -> tuple:
    """A session of the head on the verifier after its prompt's pass: the prompt's hidden states
    and the verdict's token; it owes its first proposal."""
    guesser = FedGuesser(batch, HeadState(batch.head, 64, SamplingParams(temperature=1.0), draws), depth=3)
    owner = SimpleNamespace(sequence=SimpleNamespace(committed=list(range(5, 6 + prompt))))
    guesser.passed(owner, SimpleNamespace(tokens=list(range(5, 5 + prompt)), aux=torch.randn(prompt, width), logits=1),
                   0, ())
    return guesser, owner


def test_on_the_verifier_a_session_whose_drafting_fails_goes_target_only_alone(target, mtp_target):
    batch = FedGuessBatch(load_head_of(str(mtp_target[0]), target))
    width = target.config.hidden_size
    good, good_owner = owing_session(batch, width, DraftDraws(3, MTP))
    bad, bad_owner = owing_session(batch, width, BrokenDraws(3, MTP))
    batch.flush()  # one pass of both, then each one's draw
    assert len(good.take().ids) == 3 and not good.gone
    assert bad.take() is None and "no uniform here" in bad.gone
    assert bad.layers(None) == () and batch.pending == []  # it keeps no more hidden states, owes nothing
    bad.passed(bad_owner, None, 0, ())
    assert batch.pending == []


def test_on_the_verifier_a_failed_pass_of_the_head_ends_its_sessions_drafting_not_the_pass(target, mtp_target,
                                                                                             monkeypatch):
    batch = FedGuessBatch(load_head_of(str(mtp_target[0]), target))
    sessions = [owing_session(batch, target.config.hidden_size, DraftDraws(seed, MTP)) for seed in (1, 2)]

    def fails(parts):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(batch.head, "step_many", fails)
    batch.flush()  # raises nothing: the target's verdicts stand
    assert all(guesser.take() is None and "RuntimeError" in guesser.gone for guesser, _ in sessions)


def test_on_the_verifier_a_long_prompt_feeds_the_head_its_last_window_as_a_verdicts_reply_would(target, mtp_target,
                                                                                              monkeypatch):
    width = target.config.hidden_size
    monkeypatch.setattr(proposing, "AUX_WINDOW_BYTES", 8 * width * 4)  # 8 float32 rows
    batch = FedGuessBatch(load_head_of(str(mtp_target[0]), target))
    guesser = FedGuesser(batch, HeadState(batch.head, 64, SamplingParams(), DraftDraws(1, MTP)), depth=2)
    owner = SimpleNamespace(sequence=SimpleNamespace(committed=list(range(1, 22))))
    for chunk, logits in ((range(0, 12), 0), (range(12, 20), 1)):  # a prompt of 20 in two chunks, then a verdict
        guesser.passed(owner, SimpleNamespace(tokens=list(chunk), aux=torch.randn(len(chunk), width), logits=logits),
                       0, ())
    assert (guesser.state.origin, guesser.state.known) == (12, 20)  # positions 12..19, as HiddenKeeper cuts them
    batch.flush()
    assert len(guesser.take().ids) == 2


def test_the_draft_pool_is_refused_a_head_the_replicas_serve(tiny_zoo, mtp_target):
    from specserve.cluster.pool import DraftPool

    config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root), "drafts": {"mod": str(mtp_target[0])},
                                                      "on_replica": ["mod"]},
                                           "draft_pool": {"drafts": ["sql", "mod"]}})
    with pytest.raises(ValueError, match=r"draft_pool.drafts names \['mod'\], which the target replicas serve"):
        DraftPool(config, resolve_models(config.models, config.router))
