"""A draft of another tokenizer (workers/token_bridge.py): it drafts among the tokens it shares with
the target, proposes those as target ids with an exact q, and reads the text re-encoded. In process
and through the service, its output is the target's (sampled: the rule's own test is in
test_lossless_sampling.py, with a draft of another word vocabulary)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_tokenizer
from specserve.workers.request import GenerationParams
from specserve.workers.token_bridge import BridgeError, TokenBridge, token_bytes

from conftest import OTHER_TASK


@pytest.fixture(scope="module")
def other_engine(tiny_zoo, other_tokenizer_draft):
    torch.set_num_threads(1)
    return SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"other": ModelSpec(str(other_tokenizer_draft))})


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=words[0])


def test_each_shared_draft_token_maps_to_the_target_token_of_the_same_bytes(tiny_zoo, other_tokenizer_draft):
    target, draft = load_tokenizer(str(tiny_zoo.target_dir)), load_tokenizer(str(other_tokenizer_draft))
    bridge = TokenBridge.between(target, draft)
    shared = (bridge.to_target >= 0).nonzero().flatten().tolist()
    assert 0.5 * len(draft) < len(shared) < len(draft), "a partial overlap, as between two model families"
    assert any(bridge.to_target[d] != d for d in shared), "the ids differ: a bridge that maps nothing proves little"
    target_bytes, draft_bytes = token_bytes(target), token_bytes(draft)
    for d in shared:
        t = int(bridge.to_target[d])
        assert draft_bytes[d] == target_bytes[t] and draft_bytes[d] is not None or \
            draft.convert_ids_to_tokens(d) == target.convert_ids_to_tokens(t)  # (a special token: by name)
    assert int(bridge.to_target[draft.eos_token_id]) == target.eos_token_id
    assert bool(torch.isinf(bridge.mask).sum() == len(draft) - len(shared))
    # The text round trip: the draft's tokens of what the target's decode to.
    ids = target.encode("SELECT name FROM users WHERE age > 21;", add_special_tokens=False)
    assert draft.decode(bridge.encode(ids)) == target.decode(ids)


def test_token_bytes_reads_each_kind_of_tokenizer_as_its_own():
    """A byte-level BPE through the byte alphabet; a SentencePiece-style one (no ByteLevel
    decoder) with its byte fallback as the byte, '▁' as a space and other pieces as UTF-8 (an 'é'
    piece is not the byte-level alphabet's 0xE9)."""
    from tokenizers import decoders

    from specserve.cluster.zoo.tokenizer import train_tokenizer

    byte_level = train_tokenizer(["naïve café " * 20], vocab_size=270)
    assert token_bytes(byte_level)[byte_level.convert_tokens_to_ids("Ġ")] == b" "
    pieces = ["<unk>", "<0x0A>", "\u2581the", "é", "Ġ"]
    sentencepiece = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    sentencepiece.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    mapped = token_bytes(PreTrainedTokenizerFast(tokenizer_object=sentencepiece, unk_token="<unk>"))
    assert mapped == {0: None, 1: b"\n", 2: b" the", 3: "é".encode(), 4: "Ġ".encode()}


def test_a_draft_of_another_tokenizer_keeps_greedy_output_and_gets_tokens_accepted(tiny_zoo, other_engine):
    assert set(other_engine.bridges) == {"other"}
    accepted = 0
    for task in tiny_zoo.tasks:
        prompt = tiny_zoo.prompts(task)[0]
        alone = other_engine.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
        done = other_engine.generate(prompt, GenerationParams(max_tokens=40, k=4), draft="other").complete()
        assert done.token_ids == alone.token_ids, task
        assert done.stats.proposed > 0, task
        accepted += done.stats.accepted
    assert accepted > 0


def test_a_draft_sharing_almost_no_token_is_refused_with_the_figures(tiny_zoo, tmp_path):
    from specserve.cluster.models import ModelSet, check_tokenizers

    AutoModelForCausalLM.from_pretrained(tiny_zoo.draft_dir("sql")).save_pretrained(tmp_path)
    word_tokenizer(["<end>", *(f"word{i}" for i in range(300))]).save_pretrained(tmp_path)
    with pytest.raises(BridgeError, match=r"draft 'odd' \(.+\) has another tokenizer \(.+\), and the draft's "
                                          r"tokenizer shares 0 of its 301 tokens with the target's"):
        SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"odd": ModelSpec(str(tmp_path))})
    models = ModelSet(target=str(tiny_zoo.target_dir), dtype="auto", tasks={"sql": ("sql", "odd")},
                      drafts={"sql": str(tiny_zoo.draft_dir("sql")), "odd": str(tmp_path)})
    with pytest.raises(BridgeError, match=r"draft 'odd' .+ shares 0 of its 301 tokens"):
        check_tokenizers(models)


def test_the_service_starts_with_a_draft_of_another_tokenizer_and_its_output_is_the_targets(
        service, client, tiny_zoo):
    """Greedy output is the target's; a sampled request drafts with it too (its distribution:
    test_lossless_sampling.py, through the router's request and a draft worker's stream). A seeded
    sampled request need not match the engine's here: drafting ahead, the worker drafts from its own
    tokens of a proposal the target took whole, where the engine drafts from the text re-encoded."""
    from specserve.proto.v1 import specserve_pb2 as pb

    accepted = 0
    for task in ("sql", "code"):
        for prompt in tiny_zoo.prompts(task)[:2]:
            plain = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, speculation=pb.SPECULATION_OFF))
            reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, task=OTHER_TASK, k=3,
                                                       speculation=pb.SPECULATION_ON), timeout=120)
            assert list(reply.token_ids) == list(plain.token_ids), (task, reply.stats)
            assert reply.stats.draft == "other" and reply.stats.route != "lost", reply.stats
            accepted += reply.stats.accepted_tokens
    assert accepted > 0
    sampled = client.generate(pb.GenerateRequest(prompt=tiny_zoo.prompts("sql")[1], max_tokens=32, task=OTHER_TASK,
                                                 k=3, temperature=0.8, top_p=0.95, seed=11,
                                                 speculation=pb.SPECULATION_ON), timeout=120)
    assert sampled.stats.draft == "other" and sampled.stats.proposed_tokens > 0, sampled.stats


def test_a_bridged_drafts_draws_are_keyed_by_the_targets_positions(monkeypatch):
    """Re-encoding merges what the draft drafted ("a", "b" -> "a b"), so its own positions fall
    behind the target's; each draw must use the uniform of the target position it proposes for,
    or a uniform the verifier already examined would draw again (workers/seeds.py). Every step's
    draws start at the target's committed length, in order."""
    from test_lossless_sampling import OTHER_WORDS, other_bridge, tiny_model, word_tokenizer

    from specserve.workers.sampling import SamplingParams
    from specserve.workers.seeds import DraftDraws
    from specserve.workers.session_proposer import SessionProposer

    drawn: list[int] = []
    steps: list[tuple[int, list[int]]] = []
    uniform, propose = DraftDraws.uniform, SessionProposer.propose
    monkeypatch.setattr(DraftDraws, "uniform", lambda self, position: drawn.append(position) or uniform(self, position))

    async def recorded(self, k):
        drawn.clear()
        proposal = await propose(self, k)
        steps.append((len(self.drafter.committed), list(drawn)))
        return proposal

    monkeypatch.setattr(SessionProposer, "propose", recorded)
    tokenizer = word_tokenizer()
    engine = SpecEngine(tiny_model(0), tokenizer, {"d": tiny_model(1, vocab_size=len(OTHER_WORDS))},
                        bridges={"d": other_bridge()})
    for seed in range(40):
        params = GenerationParams(max_tokens=12, sampling=SamplingParams(temperature=1.0), seed=seed, k=3)
        engine.generate([tokenizer.bos_token_id], params, draft="d").complete()
    for committed, positions in steps:
        assert positions == list(range(committed, committed + len(positions))), (committed, positions)
    assert steps and any(len(p) > 1 for _, p in steps)
