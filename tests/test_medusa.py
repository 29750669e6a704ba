"""Medusa heads (workers/heads/medusa.py): distilled on the frozen tiny-zoo target by `specserve
distill --method medusa`'s code, written and read in vLLM's format, drafting in process with the
target's last hidden state of each verify pass: greedy output the target's own (a token tree of
each head's best guesses). Sampled output keeps the target's distribution:
tests/test_lossless_sampling.py."""

from __future__ import annotations

import json
import shutil

import pytest

from specserve.cluster.zoo.presets import MedusaTraining
from specserve.workers.engine import SpecEngine
from specserve.workers.heads.format import HeadFormatError
from specserve.workers.heads.medusa import is_medusa, load_medusa
from specserve.workers.loading import ModelSpec, load_model
from specserve.workers.proposer_kinds import ProposerKind, kind_of
from specserve.workers.request import GenerationParams

from conftest import MEDUSA_TASKS

HEADS = MedusaTraining().num_heads


@pytest.fixture(scope="module")
def medusa(medusa_heads):
    return medusa_heads


@pytest.fixture(scope="module")
def corpus(medusa_heads) -> list[str]:
    return [str(medusa_heads[0].parent / f"{task}.txt") for task in MEDUSA_TASKS]


def test_distilled_heads_are_written_in_vllms_format_and_measured_as_they_serve(medusa):
    out, facts = medusa
    assert is_medusa(out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["num_heads"] == HEADS
    assert facts["greedy_identical"] and facts["method"] == "medusa"
    # Before training each head guesses the target's next token, one place too early: next to nothing
    # is accepted. 150 steps on the tiny target: 0.9-1.0 here.
    assert facts["held_out_alpha"] > 0.5, facts
    assert len(facts["held_out_alpha_per_position"]) == HEADS


def test_greedy_output_with_medusa_heads_is_the_targets_alone(tiny_zoo, medusa):
    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"medusa": ModelSpec(str(medusa[0]))})
    accepted = 0
    for task in MEDUSA_TASKS:
        for prompt in tiny_zoo.prompts(task)[:3]:
            plain = engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
            for k in (1, 3, 5):  # k beyond the heads: as many as there are
                drafted = engine.generate(prompt, GenerationParams(max_tokens=40, k=k), draft="medusa").complete()
                assert drafted.token_ids == plain.token_ids, (task, k)
                assert len(drafted.stats.accepted_per_position) <= min(k, HEADS)
                accepted += drafted.stats.accepted
    assert accepted > 0


def test_heads_of_another_target_or_with_a_cut_vocabulary_are_refused_saying_why(tiny_zoo, medusa, tmp_path):
    target = load_model(ModelSpec(str(tiny_zoo.target_dir)))
    load_medusa(medusa[0], target)  # as written
    for change, why in (({"hidden_size": 7}, "for another target"),
                        ({"truncated_vocab_size": 100}, "truncated vocabulary"),
                        ({"num_heads": 5}, "weights do not match")):
        copy = shutil.copytree(medusa[0], tmp_path / why.replace(" ", "-"))
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps(config | change))
        with pytest.raises(HeadFormatError, match=why):
            load_medusa(copy, target)


def test_a_name_of_medusa_heads_is_their_kind():
    assert kind_of("m", heads=("e",), on_verifier=("m",)) is ProposerKind.ON_VERIFIER
    assert kind_of("e", heads=("e",), on_verifier=("m",)) is ProposerKind.HEAD


def test_distill_says_which_flags_shape_an_eagle3_head_not_medusa(tiny_zoo, corpus, tmp_path, capsys):
    from specserve.cluster.cli import main

    assert main(["distill", "--method", "medusa", "--target", str(tiny_zoo.target_dir), "--corpus", *corpus,
                 "--out", str(tmp_path / "m"), "--aux-layers", "1,1,1"]) == 2
    assert "Medusa heads read the target's last hidden state" in capsys.readouterr().err
    assert main(["distill", "--method", "medusa", "--target", str(tiny_zoo.target_dir), "--corpus", *corpus,
                 "--out", str(tmp_path / "m"), "--medusa-heads", "0"]) == 2
    assert "--medusa-heads must be >= 1" in capsys.readouterr().err


def test_through_the_service_the_replica_guesses_in_its_verify_pass_and_greedy_output_is_the_targets(
        service, client, tiny_zoo):
    """The session's target replica serves the heads (MEDUSA_TASK's only proposer): each reply
    carries their next proposal; no draft worker takes part."""
    from specserve.proto.v1 import specserve_pb2 as pb

    from conftest import MEDUSA_TASK

    accepted = 0
    for task in MEDUSA_TASKS:
        for prompt in tiny_zoo.prompts(task)[:2]:
            plain = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, speculation=pb.SPECULATION_OFF))
            for k in (2, 3):
                reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, task=MEDUSA_TASK, k=k,
                                                           speculation=pb.SPECULATION_ON), timeout=120)
                assert list(reply.token_ids) == list(plain.token_ids), (task, k, reply.stats)
                assert reply.stats.draft == "medusa" and reply.stats.route != "lost", reply.stats
                accepted += reply.stats.accepted_tokens
    assert accepted > 0
    rows = [t for t in client.stats().tasks if t.task == MEDUSA_TASK and t.draft == "medusa"]
    assert rows and rows[0].accepted_tokens > 0, rows


def test_sampled_output_through_the_replicas_heads_keeps_the_targets_distribution(service, tiny_zoo, tmp_path,
                                                                                   capsys):
    """`validate --address`'s two-sample test (cluster/two_sample.py): the service's sampled draws
    with the heads against target-only ones."""
    from specserve.cluster.cli import main

    from conftest import MEDUSA_TASK

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": tiny_zoo.prompts(task)[0], "task": MEDUSA_TASK}) + "\n"
                               for task in MEDUSA_TASKS))
    code = main(["validate", "--address", service.address, "--prompts", str(prompts), "--draft", "medusa",
                 "--temperatures", "1.0", "--samples", "20", "--max-tokens", "12", "--seed", "3"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["greedy"]["identical"] and report["sampled"]["tests"], report
    assert report["sampled"]["rejected"] == 0, report["sampled"]


def test_a_proposal_is_cut_at_a_depth_with_its_tree_renumbered():
    import torch

    from specserve.workers.drafting import DraftTokens
    from specserve.workers.heads.medusa_draft import _tree
    from specserve.workers.verifier_draft import cut

    tree = _tree([[5, 6], [7, 8], [9, 10]])  # the main chain 5, 7, 9; runners-up 6, 8, 10 beside it
    assert tree.ids == [5, 6, 7, 8, 9, 10] and tree.parents == [-1, -1, 0, 0, 2, 2]
    two = cut(tree, 2)
    assert two.ids == [5, 6, 7, 8] and two.parents == [-1, -1, 0, 0]
    assert cut(tree, 3) is tree and cut(tree, 1).ids == [5, 6]
    chain = DraftTokens([1, 2, 3], tree.q.__class__(torch.tensor([[1], [2], [3]]), torch.ones(3, 1)))
    assert cut(chain, 2).ids == [1, 2] and cut(chain, 2).q.ids.tolist() == [[1], [2]] and cut(chain, 5) is chain
    sampled = DraftTokens(tree.ids, tree.q.__class__(torch.arange(12).view(6, 2), torch.full((6, 2), 0.5)), tree.parents)
    assert cut(sampled, 2).q.ids.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]  # each kept node's own q


def test_the_proposer_relays_the_last_passes_guesses_cut_to_k_and_nothing_before_a_pass():
    import asyncio

    from specserve.workers.sampling import SamplingParams
    from specserve.workers.heads.medusa_draft import _tree
    from specserve.workers.proposing import VERIFIER_NEXT, Committed
    from specserve.workers.recording import StatsRecorder
    from specserve.workers.stats import SpecStats

    from specserve.workers.verifier_draft import VerifierDraft

    draft = VerifierDraft("m", SamplingParams(), StatsRecorder(SpecStats()))
    assert draft.needs.on_verifier == "m" and draft.needs
    assert asyncio.run(draft.propose(3)).ids == []  # no pass yet: target-only
    draft.commit(Committed((), (4,), {VERIFIER_NEXT: _tree([[5, 6], [7, 8]])}))
    assert asyncio.run(draft.propose(1)).ids == [5, 6] and asyncio.run(draft.propose(0)).ids == []
    draft.commit(Committed((0,), (9,)))  # a pass that guessed nothing (its heads gone): nothing proposed
    assert asyncio.run(draft.propose(2)).ids == []


def test_medusa_heads_join_no_token_tree_and_a_session_asks_for_them_or_for_hidden_states(tiny_zoo, medusa):
    from specserve.proto.v1 import internal_pb2 as ipb
    from specserve.workers.target_replica import target_session

    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"medusa": ModelSpec(str(medusa[0]))})
    with pytest.raises(ValueError, match="join no token tree"):
        engine.generate("SELECT", GenerationParams(max_tokens=4), draft="tree", members=("medusa", "ngram"))
    with pytest.raises(ValueError, match="not both"):
        target_session(None, ipb.SessionOpen(target=ipb.TargetOpen(on_verifier="medusa", aux_layers=[1])))
