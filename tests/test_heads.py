"""EAGLE-3 heads (workers/heads/): distilled in seconds on the tiny zoo, written and read in the
speculators format (a config written by hand from the format's documented keys loads too), refused
in one line when made for another target or shaped in a way specserve does not run, trained on the
same computation they draft with, and lossless in process (greedy identical, alone and in a tree)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from specserve.cluster.cli import main
from specserve.workers.engine import SpecEngine
from specserve.cluster.zoo.head_distill import HeadEvaluation, distill_head
from specserve.workers.heads.format import FACTS
from specserve.workers.heads.eagle3 import Eagle3Head, HeadCache, config_for
from specserve.workers.heads.format import CONFIG, WEIGHTS, HeadFormatError, is_head, load_head_of, read_config
from specserve.cluster.zoo.head_training import target_features, ttt_loss
from specserve.cluster.zoo.presets import HeadTraining
from specserve.workers.request import GenerationParams
from specserve.workers.seeds import DraftDraws
from specserve.cluster.zoo.presets import TrainBudget

TRAINING = HeadTraining(budget=TrainBudget(steps=60, batch_size=8, learning_rate=3e-3), sequence_tokens=128,
                        train_tokens=24_000)


@pytest.fixture(scope="module")
def corpus(tiny_zoo, tmp_path_factory):
    documents = json.loads((tiny_zoo.root / "corpora" / "sql.json").read_text())["train"]
    path = tmp_path_factory.mktemp("corpus") / "sql.txt"
    path.write_text("\n\n".join(documents))
    return path


@pytest.fixture(scope="module")
def head_dir(tiny_zoo, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("head")
    distill_head(str(tiny_zoo.target_dir), [str(corpus)], str(out), TRAINING, HeadEvaluation(prompts=4, max_tokens=32))
    return out


@pytest.fixture(scope="module")
def engine(tiny_zoo, head_dir):
    from specserve.workers.loading import ModelSpec

    return SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)),
                           {"head": ModelSpec(str(head_dir)), "sql": ModelSpec(str(tiny_zoo.draft_dir("sql")))})


def test_a_distilled_head_is_written_in_the_speculators_format_and_measured(head_dir, tiny_zoo):
    config = json.loads((head_dir / CONFIG).read_text())
    assert config["speculators_model_type"] == "eagle3" and is_head(head_dir)
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(tiny_zoo.target_dir)
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == TRAINING.ttt_steps
    facts = json.loads((head_dir / FACTS).read_text())
    assert facts["greedy_identical"] and facts["held_out_prompts"] == 4
    # measured when this was written: alpha 0.99, 3.5 tokens per target pass (the tiny target repeats itself)
    assert facts["held_out_alpha"] > 0.6 and facts["held_out_tokens_per_pass"] > 2.0, facts
    assert 0 < facts["vocabulary_coverage"] <= 1 and facts["draft_vocab_size"] % 256 == 0


def test_a_head_drafts_greedy_output_identical_to_the_target_alone_and_in_a_tree(engine, tiny_zoo):
    for prompt in tiny_zoo.prompts("sql")[:2] + tiny_zoo.prompts("prose")[:1]:
        alone = engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
        for draft, tree in (("head", ()), ("tree", ("head", "ngram")), ("tree", ("sql", "head", "suffix"))):
            done = engine.generate(prompt, GenerationParams(max_tokens=40, k=3), draft=draft, members=tree).complete()
            assert done.token_ids == alone.token_ids, (draft, tree)
            assert done.stats.proposed > 0


def test_a_long_prompts_hidden_states_come_as_its_last_window_and_the_head_drafts_from_there(engine, tiny_zoo,
                                                                                            monkeypatch):
    """A reply's hidden states are capped (proposing.AUX_WINDOW_BYTES, under gRPC's message cap):
    the head's cache starts at the window, its positions stay absolute, the output stays the target's."""
    import specserve.workers.proposing as proposing

    width = engine.heads["head"].fc.weight.shape[1]  # 3 x the target's hidden size
    monkeypatch.setattr(proposing, "AUX_WINDOW_BYTES", 12 * width * 4)  # 12 positions in float32
    prompt = tiny_zoo.prompts("sql")[0]
    assert len(engine.tokenizer.encode(prompt)) > 24
    from specserve.workers.heads.proposer import HeadState

    starts, add = [], HeadState.add
    monkeypatch.setattr(HeadState, "add", lambda state, hidden: starts.append(hidden.start) or add(state, hidden))
    alone = engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
    done = engine.generate(prompt, GenerationParams(max_tokens=40, k=3), draft="head").complete()
    assert done.token_ids == alone.token_ids and done.stats.accepted > 0
    assert starts[0] > 0, starts  # the prompt's last 12 positions, not all of them


@pytest.mark.parametrize("room", [256, 5])  # 5: a prompt's positions fed in chunks, sharing passes
def test_heads_in_a_shared_pass_draft_what_each_drafts_alone(engine, tiny_zoo, room):
    """Sessions of one head drafting in continuous batches (HeadScheduler: one step_many pass for
    every pending session's rows, each attending to its own cache) propose exactly what each
    proposes alone, over several proposals with verdicts in between, greedy and sampled."""
    import asyncio

    from specserve.workers.sampling import SamplingParams
    from specserve.workers.config import BatchingConfig
    from specserve.workers.grpc_host import Device
    from specserve.workers.heads.proposer import HeadRun, HeadScheduler, HeadState
    from specserve.workers.proposing import HiddenRows

    head = engine.heads["head"]
    prompts = [engine.tokenizer.encode(p, add_special_tokens=False)[:n] for p, n in
               zip(tiny_zoo.prompts("sql")[:2] + tiny_zoo.prompts("prose")[:2], (30, 17, 24, 9), strict=True)]
    samplings = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(), SamplingParams(temperature=0.8)]

    def states():
        out = []
        for i, (ids, sampling) in enumerate(zip(prompts, samplings, strict=True)):
            state = HeadState(head, 128, sampling, DraftDraws(i, "head"))
            state.commit(ids)
            out.append(state)
        return out

    def verdict(state, proposed, step):
        """Keep one drafted token, append a token of our own, hand over those positions' hidden states."""
        state.commit(proposed[:1] + [(step * 7 + 3) % 200])
        ids = torch.tensor([state.committed])
        aux = target_features(engine.target, ids, head.config.aux_layers, torch.float32).aux[0]
        state.add(HiddenRows(state.known, aux[state.known : len(state.committed) - 1]))

    def feed_prompt(state):
        aux = target_features(engine.target, torch.tensor([state.committed]), head.config.aux_layers,
                              torch.float32).aux[0]
        state.add(HiddenRows(0, aux[: len(state.committed) - 1]))

    alone = [[] for _ in prompts]
    for i, state in enumerate(states()):
        feed_prompt(state)
        for step in range(3):
            alone[i].append(state.draft(3).ids)
            verdict(state, alone[i][-1], step)

    async def scenario():
        # (below the config's floor of 64 on purpose: chunks of a prompt's positions share passes)
        scheduler = HeadScheduler(head, Device(1), BatchingConfig.model_construct(max_tokens_per_pass=room))
        batched = [[] for _ in prompts]

        async def session(i, state):
            feed_prompt(state)
            for step in range(3):
                run = HeadRun(state, 3)
                await scheduler.run(run)
                batched[i].append(run.result.ids)
                verdict(state, run.result.ids, step)
        await asyncio.gather(*(session(i, state) for i, state in enumerate(states())))
        return scheduler, batched

    scheduler, batched = asyncio.run(scenario())
    assert batched == alone
    assert scheduler.counts.max_sessions > 1 and scheduler.counts.passes < sum(len(p) for p in alone) * 3


def test_training_computes_what_drafting_computes(engine, tiny_zoo):
    """The TTT unroll's logits at step s, row i, equal the head's drafting s tokens past position i
    with its cache (what a mismatch between the two would cost is exactly the acceptance)."""
    head = engine.heads["head"]
    ids = torch.tensor([engine.tokenizer.encode(tiny_zoo.prompts("sql")[0], add_special_tokens=False)[:24]])
    features = target_features(engine.target, ids, head.config.aux_layers, torch.float32)
    logits = []
    original = head.output
    head.output = lambda h: logits.append(original(h)[0]) or original(h)
    try:
        with torch.no_grad():
            ttt_loss(head, ids, features.aux, features.last @ head.lm_head.weight.T, 3)
    finally:
        head.output = original
    i = 15
    cache = HeadCache(head.config, 32, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        step, hidden = head.step(ids[0, 1 : i + 2], head.fuse(features.aux[0, : i + 1]), torch.arange(i + 1), cache)
        torch.testing.assert_close(step[-1], logits[0][0, i])
        for s in (1, 2):  # the ground-truth token, as training feeds it
            step, hidden = head.step(ids[0, i + 1 + s : i + 2 + s], hidden[-1:], torch.tensor([i + s]), cache)
            torch.testing.assert_close(step[-1], logits[s][0, i])


def test_scoring_a_continuation_counts_what_drafting_would_have_proposed(engine, tiny_zoo):
    """``score_head`` (the bench's and the policy's full-information measure) agrees, position by
    position, with the head drafting one token from the target's hidden states of the prefix."""
    from specserve.workers.sampling import SamplingParams
    from specserve.workers.heads.proposer import HeadState, score_head
    from specserve.workers.proposing import HiddenRows

    head = engine.heads["head"]
    prompt = engine.tokenizer.encode(tiny_zoo.prompts("code")[0], add_special_tokens=False)[:12]
    ids = prompt + engine.generate(prompt, GenerationParams(max_tokens=20, speculation=False)).complete().token_ids
    features = target_features(engine.target, torch.tensor([ids]), head.config.aux_layers, torch.float32)
    matches = 0
    for j in range(len(prompt), len(ids)):
        state = HeadState(head, 64, SamplingParams(), DraftDraws(0, "head"))
        state.commit(ids[:j])
        state.add(HiddenRows(0, features.aux[0, : j - 1]))
        matches += state.draft(1).ids == [ids[j]]
    assert score_head(engine.target, head, ids, len(prompt)) == (len(ids) - len(prompt), matches)
    assert matches > 0


def test_a_head_written_by_hand_from_the_documented_keys_loads(tiny_zoo, engine, tmp_path):
    """A minimal config of the keys vLLM reads, with norm_before_residual left out (vLLM's default:
    true) and no embeddings of its own (then the target's)."""
    target = engine.target
    t = target.config
    config = {"speculators_model_type": "eagle3", "draft_vocab_size": 32, "eagle_aux_hidden_state_layer_ids": [1, 1, 2],
              "transformer_layer_config": {"model_type": "llama", "vocab_size": t.vocab_size,
                                           "hidden_size": t.hidden_size, "intermediate_size": 64,
                                           "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5},
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "elsewhere", "architectures": ["LlamaForCausalLM"]}}}
    (tmp_path / CONFIG).write_text(json.dumps(config))
    head_config = read_config(tmp_path, t)
    assert head_config.norm_before_residual and head_config.head_dim == t.hidden_size // 2
    torch.manual_seed(0)
    weights = Eagle3Head(head_config, target.get_input_embeddings()).state_dict()
    weights["d2t"] = torch.arange(32) * 3  # draft id d is target id 4d
    weights["t2d"] = torch.zeros(t.vocab_size, dtype=torch.bool)
    weights["t2d"][torch.arange(32) * 4] = True
    save_file({k: v.contiguous() for k, v in weights.items() if not k.startswith("embed_tokens")},
              str(tmp_path / WEIGHTS))
    head = load_head_of(tmp_path, target)
    assert not head.own_embeddings and head.target_ids().tolist() == list(range(0, 128, 4))
    proposals = SpecEngine(target, engine.tokenizer, {}, heads={"hand": head})
    prompt = tiny_zoo.prompts("math")[0]
    alone = proposals.generate(prompt, GenerationParams(max_tokens=24, speculation=False)).complete()
    done = proposals.generate(prompt, GenerationParams(max_tokens=24, k=2), draft="hand").complete()
    assert done.token_ids == alone.token_ids and done.stats.proposed > 0
    assert all(t % 4 == 0 for t in proposals.heads["hand"].target_ids().tolist())


@pytest.mark.parametrize("change, message", [
    ({"transformer_layer_config": {"hidden_size": 999}}, "this head is for another target (hidden size 999"),
    ({"transformer_layer_config": {"vocab_size": 50}}, "this head is for another target"),
    ({"target_hidden_size": 48}, "reads hidden states of width 48"),
    ({"transformer_layer_config": {"num_hidden_layers": 2}}, "it has 2 layers; specserve runs one"),
    ({"transformer_layer_config": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}}, "its rope is 'llama3'"),
    ({"transformer_layer_config": {"model_type": "qwen3"}}, "its layer is 'qwen3'"),
    ({"transformer_layer_config": {"attention_bias": True}}, "its layer has biases"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}, "aux layers [9] do not exist"),
    ({"speculators_model_type": "eagle"}, "not an EAGLE-3 head"),
])
def test_a_head_specserve_cannot_serve_is_refused_in_one_line(head_dir, engine, tmp_path, change, message):
    config = json.loads((head_dir / CONFIG).read_text())
    for key, value in change.items():
        config[key] = config[key] | value if isinstance(value, dict) else value
    (tmp_path / CONFIG).write_text(json.dumps(config))
    (tmp_path / WEIGHTS).write_bytes((head_dir / WEIGHTS).read_bytes())
    with pytest.raises(HeadFormatError) as raised:
        load_head_of(tmp_path, engine.target)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_chat_served_target_writes_answers_in_its_template_for_training(engine, corpus):
    """With a chat template, part of the training text is the target answering instructions about
    the corpus in it, packed into full windows (the tiny zoo's tokenizer has none: one is set here)."""
    from copy import deepcopy

    from specserve.cluster.zoo.head_training import chat_answers

    tokenizer = deepcopy(engine.tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<user> {{ m['content'] }} <assistant>{% endfor %}"
    documents = corpus.read_text().split("\n\n")[:40]
    windows = chat_answers(engine.target, tokenizer, documents, 3, 256, torch.Generator().manual_seed(0))
    assert windows.shape[1] == 256 and 1 <= len(windows) <= 40
    text = tokenizer.decode(windows.flatten().tolist())
    assert "<user>" in text and "<assistant>" in text


def test_the_head_config_follows_the_target(engine):
    config = config_for(engine.target.config, 64)
    assert config.hidden_size == engine.target.config.hidden_size and config.aux_layers == (1, 1, 2)
    with pytest.raises(ValueError, match="do not exist in a target of 2 layers"):
        config_for(engine.target.config, 64, (1, 2, 3))


def test_distill_command_trains_a_head(tiny_zoo, corpus, tmp_path, capsys):
    out = tmp_path / "head"
    code = main(["distill", "--method", "eagle3", "--target", str(tiny_zoo.target_dir), "--corpus", str(corpus),
                 "--out", str(out), "--steps", "20", "--tokens", "8000", "--draft-vocab", "128"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    facts = json.loads(captured.out)
    assert facts["method"] == "eagle3" and facts["draft_vocab_size"] == 128 and facts["expected_k"] >= 1
    assert f"head {out.name}: acceptance" in captured.err and is_head(out)


def test_distill_command_refuses_bad_head_settings(tiny_zoo, corpus, tmp_path, capsys):
    base = ["distill", "--target", str(tiny_zoo.target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "x")]
    for flags, message in ((["--method", "eagle3", "--aux-layers", "1,2"], "--aux-layers takes three"),
                           (["--aux-layers", "1,2,3", "--task", "sql"], "give --method eagle3"),
                           (["--method", "draft"], "needs --task")):
        assert main(base + flags) == 2
        assert message in capsys.readouterr().err
