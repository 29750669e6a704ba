"""Sampling through the speculative path has exactly the target's distribution.

A tiny-vocabulary target/draft pair makes the target's distribution over the next three tokens
enumerable exactly (with EOS ending a sequence early). We draw 20,000 generations through the real
engine (draft sessions, verification, rollback, output assembly) per setting, each allowed k + 1
tokens so that its first step really proposes k drafts, and compare the distribution of the first
three output tokens (a lossless sampler's prefix has the target's prefix distribution) by:
- total variation distance against a bound from the sample size: E[TV] <= 0.5*sqrt(M/N) for M
  outcomes (Cauchy-Schwarz), plus McDiarmid's deviation sqrt(ln(1/delta)/(2N)) at delta = 1e-6;
- a chi-square goodness-of-fit test at significance 1e-4 (bins with expected count < 5 pooled).
Fixed seeds make the test deterministic; the tolerances say how far a correct sampler could drift.
"""

import asyncio
import math
import random

import pytest
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specserve.workers.acceptance import warp
from specserve.workers.sampling import SamplingParams
from specserve.workers.engine import SpecEngine
from specserve.workers.request import GenerationParams

WORDS = ["a", "b", "c", "d", "e", "f"]
EOS = "<eos>"
LENGTH = 3
SAMPLES = 20_000
DELTA = 1e-6


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(WORDS + [EOS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)


def tiny_model(seed: int, head_bias: list[float] | None = None, vocab_size: int = len(WORDS) + 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, max_position_embeddings=16)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharper, more varied distributions than at initialisation
    if head_bias is not None:  # a fixed preference over tokens, whatever the context
        head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=True)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.copy_(torch.tensor(head_bias))
        model.lm_head = head
    return model


@torch.inference_mode()
def exact_distribution(model, prefix, params, eos_id) -> dict[tuple, float]:
    """P(output tokens) under target-only decoding, by enumerating every continuation."""
    out = {}

    def walk(seq, prob):
        generated = seq[len(prefix):]
        if len(generated) == LENGTH or (generated and generated[-1] == eos_id):
            out[tuple(generated)] = out.get(tuple(generated), 0.0) + prob
            return
        probs = warp(model(torch.tensor([seq])).logits[0, -1:], params)[0].double()
        for token, pr in enumerate(probs.tolist()):
            if pr > 0:
                walk(seq + [token], prob * pr)

    walk(list(prefix), 1.0)
    return out


def sample_distribution(engine, params_for_seed, n, draft) -> tuple[dict[tuple, int], float]:
    tally = _tally(engine, params_for_seed, range(n), draft)
    assert tally["first_step_k"] == params_for_seed(0).k, "the first step should propose k drafts"
    return tally["counts"], tally["accepted"] / max(tally["proposed"], 1)


def _tally(engine, params_for_seed, seeds, draft, prompt: tuple[int, ...] = (), members: tuple[str, ...] = ()) -> dict:
    """The outcomes of requests with these seeds (after BOS and ``prompt``), and what their drafts
    proposed and had accepted."""
    counts: dict[tuple, int] = {}
    proposed = accepted = first_step_k = 0
    for seed in seeds:
        done = engine.generate([engine.tokenizer.bos_token_id, *prompt], params_for_seed(seed), draft=draft,
                               members=members).complete()
        outcome = tuple(done.token_ids[:LENGTH])
        if done.finish_reason == "eos" and len(done.token_ids) < LENGTH:
            outcome += (engine.tokenizer.eos_token_id,)  # the assembler drops EOS; name the outcome exactly
        counts[outcome] = counts.get(outcome, 0) + 1
        proposed += done.stats.proposed
        accepted += done.stats.accepted
        first_step_k = max(first_step_k, len(done.stats.accepted_per_position))
    return {"counts": counts, "proposed": proposed, "accepted": accepted, "first_step_k": first_step_k}


# A draft of another tokenizer (workers/token_bridge.py): a BPE over the target's text ("a b c",
# words joined by spaces), its ids in another order, EOS by name; the target's six words are its
# tokens too, its spaces and merges across them ("a b", "c d") are not (masked). Re-encoding the
# text merges what it drafted, so its own positions fall behind the target's: its draws must be
# keyed by the target's (DraftSession.keyed_to), or a uniform the verifier examined draws again.
OTHER_MERGES = [("a", " "), ("a ", "b"), ("b", " "), ("c", " "), ("c ", "d")]
OTHER_WORDS = [EOS, "f", "e", "zz", "d", "c", "b", "a", "yy", " ", "a ", "a b", "b ", "c ", "c d"]


def other_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import decoders

    tok = Tokenizer(models.BPE({w: i for i, w in enumerate(OTHER_WORDS)}, OTHER_MERGES))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)


def other_bridge():
    from specserve.workers.token_bridge import TokenBridge

    return TokenBridge.between(word_tokenizer(), other_tokenizer(), len(OTHER_WORDS))


def tiny_head(target, draft_vocab: int = 5):
    """A random EAGLE-3 head of ``target`` over a reduced vocabulary: the first ``draft_vocab`` ids."""
    from specserve.workers.heads.eagle3 import Eagle3Head, config_for

    torch.manual_seed(2)
    head = Eagle3Head(config_for(target.config, draft_vocab, (1, 1, 1)), target.get_input_embeddings())
    head.set_vocabulary(torch.arange(draft_vocab))
    with torch.no_grad():
        head.lm_head.weight.mul_(40.0)  # sharp enough to agree with the target at times
    return head.eval().requires_grad_(False)


def tiny_medusa(target):
    """Random Medusa heads of ``target``, sharp enough to agree with it at times."""
    from specserve.workers.heads.medusa import MedusaConfig, MedusaHeads

    torch.manual_seed(3)
    heads = MedusaHeads(MedusaConfig(target.config.hidden_size, target.config.vocab_size, num_heads=3))
    with torch.no_grad():
        for lm_head in heads.lm_heads:
            lm_head.weight.copy_(target.lm_head.weight + 0.5 * torch.randn_like(lm_head.weight))
    return heads.eval().requires_grad_(False)


def tiny_mtp(target):
    """A random MTP module of ``target`` over its whole vocabulary, its output head the target's
    disturbed (sharp enough to agree with it at times)."""
    from specserve.workers.heads.mtp import MtpModule, mtp_config_for

    torch.manual_seed(4)
    module = MtpModule(mtp_config_for(target.config), target.get_input_embeddings())
    with torch.no_grad():
        module.lm_head.weight.copy_(target.lm_head.weight + 0.5 * torch.randn_like(module.lm_head.weight))
    return module.eval().requires_grad_(False)


def _tally_share(sampling: SamplingParams, k: int, max_support: int, seeds: range, proposer: str) -> dict:
    """One process's share of the seeds, on the test's pair built afresh (the same weights: seeded):
    the draft model ("d"), the same with its output head cut to 5 of the 7 tokens ("pruned", as
    FR-Spec cuts a draft's vocabulary), an EAGLE-3 head of the target ("head"), Medusa heads of it
    ("medusa"), an MTP module ("mtp") or a draft of another tokenizer ("other")."""
    from specserve.workers.vocabulary import prune_head

    torch.set_num_threads(1)
    target = tiny_model(0)
    heads = {"head": tiny_head(target)} if proposer == "head" else {"mtp": tiny_mtp(target)} if proposer == "mtp" else {}
    medusa = {"medusa": tiny_medusa(target)} if proposer == "medusa" else {}
    draft = prune_head(tiny_model(1), torch.arange(5)) if proposer == "pruned" else tiny_model(1)
    if proposer == "other":
        draft = tiny_model(1, vocab_size=len(OTHER_WORDS))
    engine = SpecEngine(target, word_tokenizer(), {"d": draft}, draft_max_support=max_support, heads=heads,
                        medusa=medusa, bridges={"d": other_bridge()} if proposer == "other" else None)
    if proposer == "cascade":
        return _tally(engine, params_for(sampling, k), seeds, "cascade", cascade_prompt(), ("d",))
    fed = proposer in ("head", "medusa", "mtp")  # their first step proposes nothing: no hidden state before a pass
    return _tally(engine, params_for(sampling, k, int(fed)), seeds, proposer if fed else "d")


def sample_distribution_split(sampling: SamplingParams, k: int, max_support: int, n: int, proposer: str = "d",
                              processes: int = 2) -> tuple[dict[tuple, int], float]:
    """``sample_distribution`` of the test's pair with the seeds split between processes: the same
    requests (each is seeded), so the same counts, in half the time on two cores."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    shares = [range(i, n, processes) for i in range(processes)]
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        tallies = list(pool.map(_tally_share, *zip(*[(sampling, k, max_support, share, proposer)
                                                      for share in shares])))
    counts: dict[tuple, int] = {}
    for tally in tallies:
        for outcome, count in tally["counts"].items():
            counts[outcome] = counts.get(outcome, 0) + count
    longest = max(t["first_step_k"] for t in tallies)
    assert longest == k or proposer == "cascade" and longest > k, "the first step should propose k drafts"
    return counts, sum(t["accepted"] for t in tallies) / max(sum(t["proposed"] for t in tallies), 1)


def params_for(sampling: SamplingParams, k: int, steps_before: int = 0):
    """Seeded requests with room for one full step of k drafts plus the bonus token, after
    ``steps_before`` target-only steps (a head's first)."""
    return lambda seed: GenerationParams(max_tokens=max(LENGTH, k + 1) + steps_before, sampling=sampling, seed=seed,
                                         k=k)


def assert_same_distribution(exact: dict, counts: dict, n: int) -> None:
    assert set(counts) <= set(exact), f"impossible outcomes sampled: {set(counts) - set(exact)}"
    outcomes = sorted(exact)
    tv = 0.5 * sum(abs(counts.get(o, 0) / n - exact[o]) for o in outcomes)
    bound = 0.5 * math.sqrt(len(outcomes) / n) + math.sqrt(math.log(1 / DELTA) / (2 * n))
    assert tv < bound, f"TV {tv:.4f} exceeds {bound:.4f}"
    observed, expected = _pool([counts.get(o, 0) for o in outcomes], [exact[o] * n for o in outcomes])
    assert chisquare(observed, expected).pvalue > 1e-4


def _pool(observed, expected, minimum=5.0):
    """Merge outcomes with small expected counts into one bin so the chi-square test is valid."""
    big = [(o, e) for o, e in zip(observed, expected) if e >= minimum]
    small_o = sum(o for o, e in zip(observed, expected) if e < minimum)
    small_e = sum(e for e in expected if e < minimum)
    obs, exp = [o for o, _ in big], [e for _, e in big]
    if small_e > 0:
        obs.append(small_o)
        exp.append(small_e)
    scale = sum(obs) / sum(exp)  # chisquare wants equal totals; float rounding only
    return obs, [e * scale for e in exp]


# The acceptance rule itself is checked case by case, batched and without a model, in
# test_acceptance_distribution.py: temperature, top-k, top-p, k = 1..8, dense, truncated, one-hot,
# equal and disjoint q, in seconds. Here the whole engine runs, every setting with the slow suite:
# each costs 1.5-3 minutes on an idle 2-core machine (20,000 generations), many more on a loaded
# one. The default run keeps the first setting through batching workers (the service's path, below)
# and the in-process engine with a head and with a reduced vocabulary. (sampling, k, draft max support)
SETTINGS = [
    pytest.param(SamplingParams(temperature=1.0, top_p=0.9), 2, 32, marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=0.7, top_k=3), 3, 32, marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=1.0), 3, 2, marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=1.3, top_k=4, top_p=0.9), 4, 32, marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=1.0, top_p=0.8), 1, 32, marks=pytest.mark.slow),
    pytest.param(SamplingParams(temperature=0.5, top_k=5), 8, 32, marks=pytest.mark.slow),
]
SETTING_IDS = ["t1-topp0.9-k2", "t0.7-topk3-k3", "t1-k3-draft-top2", "t1.3-topk4-topp0.9-k4", "t1-topp0.8-k1",
               "t0.5-topk5-k8"]


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


@pytest.mark.parametrize("sampling,k,max_support", SETTINGS, ids=SETTING_IDS)
def test_speculative_sampling_matches_target_distribution(tokenizer, sampling, k, max_support):
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, max_support, SAMPLES)
    assert 0.05 < alpha < 0.98, "the pair should both accept and reject, or the test proves little"
    assert_same_distribution(exact, counts, SAMPLES)


# ~105 s on an AMD EPYC 2-core host: with the slow suite. A head's q is a SparseDist like any
# draft's; the default run keeps the draft's sampled test through batching and a failover.
@pytest.mark.slow
def test_sampling_through_an_eagle3_head_matches_target_distribution(tokenizer):
    """A head drafting over 5 of the 7 tokens from the target's hidden states: q is its distribution
    over its vocabulary, zero elsewhere, mapped to target ids; the output is the target's. Its first
    step proposes nothing (no hidden states before the target's first pass), so each request is
    allowed a second step of k drafts."""
    sampling, k = SamplingParams(temperature=1.0), 2
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, SAMPLES // 2, proposer="head")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, SAMPLES // 2)


# With the slow suite: its q is a head's (as the EAGLE-3 head's above, over the whole vocabulary),
# drafted on from the module's own output.
@pytest.mark.slow
def test_sampling_through_an_mtp_module_matches_target_distribution(tokenizer):
    """An MTP module drafting from the target's last hidden state and its own outputs: q is its
    distribution over the target's vocabulary; the output is the target's."""
    sampling, k = SamplingParams(temperature=0.8, top_k=5), 3
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, SAMPLES // 2, proposer="mtp")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, SAMPLES // 2)


# With the slow suite (25-50 s here): the default run samples Medusa heads end to end through the
# service (tests/test_medusa.py, validate's two-sample test); their q is a draft's kind, whose rule
# tests/test_acceptance_distribution.py checks case by case.
@pytest.mark.slow
def test_sampling_through_medusa_heads_matches_target_distribution(tokenizer):
    """Medusa heads' sampled trees: a depth's two candidates drawn independently from head i's
    distribution, which does not read the tokens drawn before it; q is that distribution, the tree
    rule verifies them, and the output is the target's."""
    sampling, k, n = SamplingParams(temperature=1.0, top_p=0.9), 3, SAMPLES // 4  # the bounds are n's
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, n, proposer="medusa")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, n)


# With the slow suite (25-35 s): the default run samples a reduced vocabulary through the EAGLE-3
# head above (5 of the 7 tokens, as here), and tests/test_vocabulary.py checks the pruned head's logits.
@pytest.mark.slow
def test_sampling_through_a_draft_with_a_reduced_vocabulary_matches_target_distribution(tokenizer):
    """A draft whose output head keeps 5 of the 7 tokens (workers/vocabulary.py): its logits are -inf
    off them, so q, warped and cut to its support, is zero there; the output is the target's."""
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 2
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, SAMPLES // 4, proposer="pruned")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, SAMPLES // 4)


def test_sampling_through_a_draft_of_another_tokenizer_matches_target_distribution(tokenizer):
    """A draft of another vocabulary (OTHER_WORDS: ids in another order, eight tokens the target
    lacks, merges across its words): it draws among the seven it shares, proposes them as target ids
    with that q, and reads the text re-encoded (fewer tokens than the target's). In process, and
    through the router's request and a draft worker's stream (batched): the output is the target's."""
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 2
    exact = exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, SAMPLES // 4, proposer="other")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, SAMPLES // 4)
    engine = SpecEngine(tiny_model(0), tokenizer, {"d": tiny_model(1, vocab_size=len(OTHER_WORDS))})
    counts, passes, _ = sample_distribution_batched(engine.target, engine.drafts["d"], tokenizer,
                                                    params_for(sampling, k), SAMPLES // 4, bridge=other_bridge())
    assert passes["draft"].max_sessions > 1
    assert_same_distribution(exact, counts, SAMPLES // 4)


def cascade_prompt() -> tuple[int, ...]:
    """Words after BOS that say "a b c" twice, "a b" the second time: prompt lookup guesses on."""
    return tuple(word_tokenizer().convert_tokens_to_ids(["a", "b", "c", "a", "b"]))


@pytest.mark.slow  # ~60-70 s; by default the cascade's q is checked row by row (tests/test_cascade.py), and
# sampled requests go through the service's (tests/test_service.py)
def test_sampling_through_a_cascade_matches_target_distribution(tokenizer):
    """A cascade (workers/drafting.py): prompt lookup guesses after a prompt that repeats itself, the
    draft verifies the guesses in its first pass and proposes past k (k 1) down those it draws. In
    process, and through the router's request and a batching draft worker's stream (its session
    opened with the cascade's guesses): the output is the target's."""
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 1
    prefix = [tokenizer.bos_token_id, *cascade_prompt()]
    exact = exact_distribution(tiny_model(0), prefix, sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution_split(sampling, k, 32, SAMPLES // 4, proposer="cascade")
    assert 0.05 < alpha < 0.98, alpha
    assert_same_distribution(exact, counts, SAMPLES // 4)
    engine = SpecEngine(tiny_model(0), tokenizer, {"d": tiny_model(1)})
    counts, passes, _ = sample_distribution_batched(engine.target, engine.drafts["d"], tokenizer,
                                                    params_for(sampling, k), SAMPLES // 4, cascade=True)
    assert passes["draft"].max_sessions > 1 and passes["past_k"] > 0, passes
    assert_same_distribution(exact, counts, SAMPLES // 4)


@pytest.mark.slow  # as long as a setting above; the rule's own case is in test_acceptance_distribution.py
def test_draft_equal_to_target_accepts_everything(tokenizer):
    target = tiny_model(0)
    sampling = SamplingParams(temperature=1.0)
    engine = SpecEngine(target, tokenizer, {"same": target})
    exact = exact_distribution(target, [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution(engine, params_for(sampling, 2), SAMPLES // 2, "same")
    # p and q come from different pass shapes (k+1 tokens vs one), equal up to float rounding.
    assert alpha > 0.999
    assert_same_distribution(exact, counts, SAMPLES // 2)


@pytest.mark.slow  # as long as a setting above; the rule's own case is in test_acceptance_distribution.py
def test_draft_disjoint_from_target_accepts_nothing(tokenizer):
    # With top_k=2 the target only ever picks from {a, b} and the draft only from {e, f}.
    target = tiny_model(0, head_bias=[20, 20, 0, 0, -20, -20, -20])
    draft = tiny_model(1, head_bias=[-20, -20, 0, 0, 20, 20, -20])
    sampling = SamplingParams(temperature=1.0, top_k=2)
    engine = SpecEngine(target, tokenizer, {"far": draft})
    exact = exact_distribution(target, [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, alpha = sample_distribution(engine, params_for(sampling, 2), SAMPLES // 4, "far")
    assert alpha == 0.0
    assert_same_distribution(exact, counts, SAMPLES // 4)


NEIGHBOURS = 64  # sessions in flight at once: each step shares its passes with up to 63 others


def sample_distribution_batched(target, draft, tokenizer, params_for_seed, n, tree: bool = False,
                                fail: str | None = None, fail_every: int = 1, bridge=None, cascade: bool = False):
    """As ``sample_distribution``, through the router's request loop (``Session``) against workers
    that batch: every draft and verify step runs in passes shared with other requests' steps. With
    ``tree``, each step proposes a token tree of the draft, prompt lookup and suffix decoding. With
    ``fail`` ("draft" or "target"), every ``fail_every``-th request (by seed) starts on a worker of
    that kind of its own that fails (UNAVAILABLE) at its first or second step, drawn at random, and
    goes on on a spare. With ``bridge``, the draft is of another tokenizer (its workers' streams
    bridged: workers/token_bridge.py). With ``cascade``, the draft runs under prompt lookup after
    ``cascade_prompt`` (workers/drafting.py). Returns the counts of all requests, the passes, and the counts of those
    that started on a failing worker (chosen before they ran: the split does not depend on outputs)."""
    from fake_workers import DRAFT, FakeDirectory, FakeWorker

    from specserve.router.config import TimeoutsConfig
    from specserve.workers.draft_length import DraftLength
    from specserve.router.policy import Route
    from specserve.router.proposers import ProposerFactory
    from specserve.router.request import Request, Routing, Workers
    from specserve.workers.lookup import DraftFree
    from specserve.workers.proposer_kinds import CASCADE, TREE
    from specserve.router.tasks import ResolvedTask
    from specserve.router.validation import ValidRequest
    from specserve.workers.batching import Scheduler
    from specserve.workers.config import BatchingConfig
    from specserve.workers.grpc_host import Device
    from specserve.workers.kv_pool import Budget, KVPool, KVShape

    counts: dict[tuple, int] = {}
    failing_counts: dict[tuple, int] = {}  # of the requests that started on a failing worker
    passes = {}
    failovers = []  # the workers that failed a request

    async def scenario():
        device = Device(1)
        schedulers = {name: Scheduler(m, KVPool(KVShape.of(m), Budget(2**26)), device,
                                         BatchingConfig(max_sessions_per_pass=NEIGHBOURS))
                      for name, m in (("target", target), ("draft", draft))}
        verifier = FakeWorker("target", "t0", target, scheduler=schedulers["target"])
        directory = FakeDirectory(verifier, FakeWorker("draft", "d0", draft, scheduler=schedulers["draft"],
                                                       bridge=bridge))
        gate = asyncio.Semaphore(NEIGHBOURS)
        name = TREE if tree else CASCADE if cascade else DRAFT
        draft_free = DraftFree()  # its suffix tries learn from the finished requests' outputs
        proposers = ProposerFactory(draft_free, {"t": (DRAFT, "ngram", "suffix")}, cascades={"t": DRAFT})
        prompt = [tokenizer.bos_token_id, *(cascade_prompt() if cascade else ())]

        spares = {kind: FakeWorker(kind, f"spare-{kind}", m, scheduler=schedulers[kind])
                  for kind, m in (("target", target), ("draft", draft))}
        failing = random.Random(fail)

        def fails(seed: int) -> bool:
            return fail is not None and seed % fail_every == 0

        def directory_of(seed: int) -> FakeDirectory:
            if not fails(seed):
                return directory
            model = target if fail == "target" else draft
            own = FakeWorker(fail, f"{fail}-{seed}", model, fail_at_step=failing.choice((1, 2)),
                             scheduler=schedulers[fail])
            others = [verifier, spares["target"]] if fail == "draft" else [spares["draft"]]
            failovers.append(own)
            return FakeDirectory(own, *others, spares[fail])

        async def one(seed: int) -> None:
            params = params_for_seed(seed)
            request = ValidRequest(prompt, params, "t", name, params.k, "on")
            routing = Routing(ResolvedTask("t", "request", 1.0), Route(name, params.k, "requested"),
                              DraftLength("fixed", params.k, params.k))
            session = Request(request, routing, Workers(tokenizer, directory_of(seed), TimeoutsConfig(), proposers))
            async with gate:
                tokens = [t async for chunk in session.run() for t in chunk.token_ids]
            draft_free.learn("t", tokens)
            outcome = tuple(tokens[:LENGTH])
            if session.decoding.output.finish_reason == "eos" and len(tokens) < LENGTH:
                outcome += (tokenizer.eos_token_id,)
            counts[outcome] = counts.get(outcome, 0) + 1
            if fails(seed):
                failing_counts[outcome] = failing_counts.get(outcome, 0) + 1

        await asyncio.gather(*(one(seed) for seed in range(n)))
        passes.update({name: s.counts for name, s in schedulers.items()})
        passes["trees"] = sum(bool(p.parents) for p in verifier.proposals)
        passes["past_k"] = sum(len(p.ids) > max(1, params_for_seed(0).k) for p in verifier.proposals)
        passes["failed"] = sum(w.dead for w in failovers)

    asyncio.run(scenario())
    return counts, passes, failing_counts


def test_sampling_through_batching_workers_and_a_failover_matches_target_distribution(tokenizer):
    """The default setting again, each request's steps batched with up to 63 neighbours'; every
    other request starts on a target replica of its own that fails at its first or second step and
    goes on on a spare, reopened with a seed of its own (``replacement_seed``) and re-prefilled from
    the committed tokens. All 20,000 outputs have the target's distribution, and so have the 10,000
    that failed over and the 10,000 that did not, each alone (which half is which is fixed before
    they run): one run holds the tests (a draft worker's failover, in the slow suite, takes the same
    re-opening)."""
    exact, counts, passes, failing = sample_the_default_setting_batched(tokenizer, SAMPLES, fail="target",
                                                                          fail_every=2)
    assert passes["target"].max_sessions > NEIGHBOURS // 2 and passes["draft"].max_sessions > NEIGHBOURS // 2
    assert passes["failed"] > SAMPLES // 4, passes["failed"]  # most of the failing half lost a worker mid-request
    assert sum(failing.values()) == SAMPLES // 2
    assert_same_distribution(exact, counts, SAMPLES)
    assert_same_distribution(exact, failing, SAMPLES // 2)
    assert_same_distribution(exact, {o: n - failing.get(o, 0) for o, n in counts.items()}, SAMPLES // 2)  # the rest


def sample_the_default_setting_batched(tokenizer, samples: int, **how):
    """The default setting (temperature 1, top_p 0.9, k 2) through batching workers, ``how`` as
    ``sample_distribution_batched`` takes it: (the target's exact distribution, counts, passes,
    counts of the requests that started on a failing worker)."""
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 2
    engine = SpecEngine(tiny_model(0), tokenizer, {"d": tiny_model(1)})  # switches both to the pooled attention
    exact = exact_distribution(engine.target, [tokenizer.bos_token_id], sampling, tokenizer.eos_token_id)
    counts, passes, failing = sample_distribution_batched(engine.target, engine.drafts["d"], tokenizer,
                                                          params_for(sampling, k), samples, **how)
    return exact, counts, passes, failing


@pytest.mark.slow  # the same re-opening as a target replica's, which the default run samples above
def test_sampling_across_a_draft_workers_failover_matches_target_distribution(tokenizer):
    """Each request's draft worker fails at its first or second step, and the request goes on on
    another, reopened with a seed of its own (``replacement_seed``) and re-prefilled from the
    committed tokens: the output is still the target's distribution."""
    samples = SAMPLES // 2
    exact, counts, passes, _ = sample_the_default_setting_batched(tokenizer, samples, fail="draft")
    assert passes["failed"] > samples // 2, passes["failed"]  # most requests lost a worker mid-request
    assert_same_distribution(exact, counts, samples)


@pytest.mark.slow  # 40 s here; the tree rule's own distribution runs by default (tests/test_tree_acceptance.py)
def test_sampling_through_a_token_tree_matches_target_distribution(tokenizer):
    """Each step a tree: the draft's sampled chain beside prompt lookup's and suffix decoding's
    (deterministic, learning from the other requests' outputs as they finish), verified by recursive
    rejection in batched passes. Fewer samples than the chain's test (its TV bound is looser)."""
    samples = SAMPLES // 2
    exact, counts, passes, _ = sample_the_default_setting_batched(tokenizer, samples, tree=True)
    assert passes["trees"] > samples // 10, passes["trees"]  # trees were verified, not just chains
    assert_same_distribution(exact, counts, samples)
