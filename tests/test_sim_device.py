"""The simulated device (workers/sim_device.py): its curves, its config, its stream, and a scheduler
on it. A timing model beside the real models: the outputs on it are still the target's own, which
is what these tests check, never how fast anything ran."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from specserve.cluster.placement import actor_options, on_gpu
from specserve.workers.batching import Scheduler
from specserve.workers.drafting import DraftTokens
from specserve.workers.config import BatchingConfig, DraftPoolConfig, TargetConfig
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import PooledSequence, Segment
from specserve.workers.sim_device import (ANY_TASK, CURVES, DRAFT, H100_70B_TARGET, H200_DEMO_DRAFT, H200_DEMO_TARGET,
                                          HEAD, PRESETS, ROLES, TARGET, PassShape, SimConfig, SimStream, shape_of)
from specserve.workers.verifying import TargetSession

from scheduled import GREEDY, decode_alone


@pytest.mark.parametrize("curve, sessions, tokens, ms", [
    (H200_DEMO_TARGET, 1, 1, 0.96), (H200_DEMO_TARGET, 16, 1, 1.17), (H200_DEMO_TARGET, 64, 1, 1.85),
    (H200_DEMO_TARGET, 64, 5, 2.19), (H200_DEMO_DRAFT, 1, 1, 0.57), (H200_DEMO_DRAFT, 16, 1, 0.83),
    (H200_DEMO_DRAFT, 64, 1, 1.25)])
def test_the_h200_preset_gives_the_graphed_passes_it_was_fitted_to(curve, sessions, tokens, ms):
    assert curve.ms(PassShape(rows=sessions * tokens, sessions=sessions)) == pytest.approx(ms, abs=1e-9)


def test_a_curve_interpolates_between_its_points_and_extends_past_the_last():
    at = lambda n: H200_DEMO_TARGET.ms(PassShape(n, n))  # noqa: E731
    assert at(1) < at(8) < at(16) < at(40) < at(64) < at(128)
    # Past 64 sessions, the slope of the last segment (16 to 64).
    assert at(128) - at(64) == pytest.approx((at(64) - at(16)) * 64 / 48, rel=1e-9)


def test_a_production_target_is_bound_by_its_weights_until_the_rows_outweigh_them():
    one = H100_70B_TARGET.ms(PassShape(1, 1))
    assert 14 < one < 20  # the ~16 ms a step serving engines report for 70B on 4 H100s
    # Verifying 5 tokens for one session costs what one does (reading the weights bounds both)...
    assert H100_70B_TARGET.ms(PassShape(5, 1)) == pytest.approx(one)
    # ... while 64 sessions x 5 rows are past the roofline's turn: the rows' compute sets the pass.
    wide = H100_70B_TARGET.ms(PassShape(320, 64))
    assert wide - H100_70B_TARGET.ms(PassShape(64, 64)) == pytest.approx(320 * 0.059 - 14.9, rel=1e-6)
    # Attending over a long context adds its KV reads.
    assert H100_70B_TARGET.ms(PassShape(64, 64, positions=64_000)) > H100_70B_TARGET.ms(PassShape(64, 64)) + 2


def test_every_preset_names_a_curve_for_every_role_and_a_model_can_take_another():
    assert all(set(roles) == set(ROLES) and set(roles.values()) <= set(CURVES) for roles in PRESETS.values())
    config = SimConfig(preset="h100-70b", models={"code": "h200-demo-draft"})
    assert config.curve("code", DRAFT) is H200_DEMO_DRAFT
    assert config.curve("sql", DRAFT) is CURVES[PRESETS["h100-70b"][DRAFT]]
    assert config.curve("eagle3", HEAD) is CURVES[PRESETS["h100-70b"][HEAD]]


def test_an_unknown_preset_or_curve_is_refused_naming_what_exists():
    with pytest.raises(ValidationError, match="sim.preset must be one of h200-demo, h100-70b, got 'a100'"):
        TargetConfig(device="sim", sim={"preset": "a100"})
    with pytest.raises(ValidationError, match="sim.models names curves nope for code; the curves: h200-demo-target"):
        DraftPoolConfig(device="sim", sim={"models": {"code": "nope"}})
    with pytest.raises(ValidationError, match=r"auto\|gpu\|resource\|sim"):
        TargetConfig(device="simulated")


def test_a_simulated_device_is_placed_by_its_custom_resource_without_a_gpu():
    config = TargetConfig(device="sim")
    nodes = [{"Alive": True, "Resources": {"GPU": 8, config.device_resource: 1}}]
    assert not on_gpu(config, nodes)
    assert actor_options(config, on_gpu(config, nodes)) == {"num_cpus": 0, "resources": {config.device_resource: 1}}


def test_the_stream_holds_a_pass_for_its_modelled_time_and_counts_a_math_that_outran_it(monkeypatch):
    """On a clock that moves only as the stream sleeps (and as the test says the math took), so a
    loaded machine's scheduling cannot turn a modelled pass into an overrun."""
    from specserve.workers import sim_device

    now = [100.0]
    monkeypatch.setattr(sim_device, "time", SimpleNamespace(perf_counter=lambda: now[0],
                                                          sleep=lambda s: now.__setitem__(0, now[0] + s)))
    stream = SimStream()
    started = now[0]
    assert stream.hold(0.01, started) == pytest.approx(0.01)
    assert now[0] == pytest.approx(started + 0.01) and stream.overrun_passes == 0  # it waited the pass out
    # A pass whose math began a second ago and was modelled at a millisecond: it took the second.
    stream = SimStream()
    busy = stream.hold(0.001, now[0] - 1.0)
    assert busy == pytest.approx(1.0) and stream.overrun_passes == 1
    assert stream.overrun_seconds == pytest.approx(0.999)
    # A pass queued behind one that has not ended begins when it ends.
    stream.busy_until = now[0] + 0.01
    assert stream.hold(0.005, now[0]) == pytest.approx(0.005)
    assert now[0] == pytest.approx(stream.busy_until)


def test_a_pass_shape_counts_rows_sessions_and_the_positions_attended(tiny_engine):
    pool = KVPool(KVShape.of(tiny_engine.target), Budget(2**24))
    segments = [Segment(pool.take(64), 10, [1, 2, 3], 3), Segment(pool.take(64), 0, list(range(20)), 1)]
    assert shape_of(segments) == PassShape(rows=23, sessions=2, positions=13 + 20)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "in-turn"])
def test_sessions_sharing_a_simulated_devices_passes_decode_what_each_decodes_alone(tiny_engine, overlap):
    """The timing changes nothing in the math: greedy tokens as target-only alone, whether the next
    pass is planned and launched while one holds the device (overlap) or after it; and the device's
    busy time at least the passes' modelled times (each pass holds at least its curve's fixed cost)."""
    target = tiny_engine.target
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 300, (int(n),), generator=gen).tolist() for n in (7, 19, 33, 12)]
    tokens = 12
    pool = KVPool(KVShape.of(target), Budget(2**28))
    device = Device(1, sim=SimConfig())
    scheduler = Scheduler(target, pool, device, BatchingConfig(overlap=overlap, back_to_back=False),
                          timing=device.timing("target", TARGET))
    assert scheduler.overlapped == overlap

    async def batched() -> list[list[int]]:
        sessions = [TargetSession(PooledSequence(pool.take(len(p) + tokens + 1), p), GREEDY, torch.Generator())
                    for p in prompts]
        # Staggered: each session's steps arrive while another's pass holds the device.
        done = await asyncio.gather(*(decoded(scheduler, s, tokens) for s in sessions[:2]),
                                    *(one_step_at_a_time(scheduler, s, tokens) for s in sessions[2:]))
        return [[v.token for v in d] for d in done]

    alone = decode_alone(target, prompts, tokens)
    assert asyncio.run(batched()) == alone
    assert asyncio.run(batched()) == alone  # again, on another event loop
    assert scheduler.counts.max_sessions > 1
    assert not scheduler.passing and not scheduler.waiting and not scheduler.active
    assert device.busy_seconds >= scheduler.counts.passes * H200_DEMO_TARGET.fixed_ms / 1000
    assert device.timing("target", TARGET) is H200_DEMO_TARGET
    assert Device(1).timing("target", TARGET) is None  # a real device: its passes' own time


async def decoded(scheduler: Scheduler, session: TargetSession, tokens: int) -> list:
    """A session's decode run of ``tokens``, submitted once: its verdicts."""
    return (await scheduler.run(session.decode(tokens))).result


async def one_step_at_a_time(scheduler: Scheduler, session: TargetSession, tokens: int) -> list:
    """A session stepping target-only a token a step, each step submitted once the last is settled."""
    verdicts = []
    for _ in range(tokens):
        await scheduler.run(step := session.step(DraftTokens.empty()))
        verdicts.append(step.result)
    return verdicts


def test_the_in_process_engine_on_a_simulated_device_generates_what_it_generates_on_this_one(tiny_zoo, tiny_engine):
    """Every pass of the engine's models (the target's, each draft's, run alone) holds one simulated
    device for its modelled time: greedy output with each draft, prompt lookup and OFF as on the
    host's own device, and the device busy with at least every target pass's fixed cost."""
    from specserve.cluster.local import zoo_engine
    from specserve.workers.request import GenerationParams

    engine = zoo_engine(tiny_zoo, tiny_zoo.draft_names)  # its own: the shared engine stays on this host's device
    stream = engine.simulate(SimConfig(preset="h200-demo"))
    passes = 0
    for draft in (None, *tiny_zoo.draft_names, "ngram"):
        params = GenerationParams(max_tokens=16, k=3, speculation=draft is not None)
        for task in tiny_zoo.tasks[:2]:
            prompt = tiny_zoo.prompts(task)[0]
            on_sim = engine.generate(prompt, params, draft=draft).complete()
            assert on_sim.token_ids == tiny_engine.generate(prompt, params, draft=draft).complete().token_ids, \
                (draft, task)
            passes += on_sim.stats.target_passes
    assert stream.busy_seconds >= passes * H200_DEMO_TARGET.fixed_ms / 1000 > 0


# A cluster of its own (~3 min on a 2-core host): with the slow suite. `specserve host-path --sim`
# checks the same through the service at every level of its run.
@pytest.mark.slow
def test_the_service_on_simulated_devices_answers_as_the_target_alone(tiny_zoo, tiny_engine, specserve_home):
    """`specserve serve --sim h200-demo`: every model process on a simulated device, greedy tokens
    through the service (draft models, speculation ON and OFF) identical to the target alone; with
    the first task's draft aligned 0 there (every argmax shifted a token), still identical, and
    that draft accepted far less there than its ~0.8."""
    import os

    from conftest import free_port, serve_in_subprocess
    from specserve.proto.v1 import specserve_pb2 as pb
    from specserve.workers.request import GenerationParams

    misaligned = (tiny_zoo.tasks[0], tiny_zoo.default_draft(tiny_zoo.tasks[0]))
    args = ["--zoo", str(tiny_zoo.root), "--sim", "h200-demo", "--port", "0", "--metrics-port", str(free_port()),
            "--set", f"draft_pool.sim.alignment={{{misaligned[1]}: {{{misaligned[0]}: 0.0}}}}"]
    with serve_in_subprocess(args, dict(os.environ, SPECSERVE_HOME=specserve_home)) as (client, _):
        for task in tiny_zoo.tasks:
            prompt = tiny_zoo.prompts(task)[0]
            alone = tiny_engine.generate(prompt, GenerationParams(max_tokens=24, speculation=False)).complete()
            for speculation in (pb.SPECULATION_ON, pb.SPECULATION_OFF):
                reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=24, speculation=speculation,
                                                           task=task))
                assert list(reply.token_ids) == alone.token_ids, (task, speculation, reply.stats.draft)
                if (task, reply.stats.draft) == misaligned:
                    assert reply.stats.accepted_tokens < 0.3 * reply.stats.proposed_tokens, reply.stats


def test_an_alignment_set_by_hand_sets_a_target_copys_acceptance_per_task_and_changes_no_output(tiny_zoo,
                                                                                                tiny_engine):
    """A draft that is a copy of the target, aligned 0 on one task and unset on another: every
    greedy proposal rejected on the first (its argmax shifted a token), every one accepted on the
    second, the output the target's on both; and in between, the share it is set to."""
    from specserve.cluster.local import zoo_engine
    from specserve.workers.loading import ModelSpec
    from specserve.workers.request import GenerationParams

    first, second = tiny_zoo.tasks[:2]
    engine = zoo_engine(tiny_zoo, [], extra={"copy": ModelSpec(str(tiny_zoo.target_dir))})
    engine.simulate(SimConfig(alignment={"copy": {first: 0.0, ANY_TASK: 1.0}}))
    params = GenerationParams(max_tokens=24, k=3)
    accepted = {}
    for task in (first, second):
        engine.task = task
        prompt = tiny_zoo.prompts(task)[0]
        done = engine.generate(prompt, params, draft="copy").complete()
        alone = tiny_engine.generate(prompt, GenerationParams(max_tokens=24, speculation=False)).complete()
        assert done.token_ids == alone.token_ids, task
        accepted[task] = done.stats.accepted / done.stats.proposed
    assert accepted == {first: 0.0, second: 1.0}
    engine.simulate(SimConfig(alignment={"copy": {ANY_TASK: 0.5}}))
    done = engine.generate(tiny_zoo.prompts(second)[1], GenerationParams(max_tokens=64, k=1, seed=1),
                           draft="copy").complete()
    assert 0.3 < done.stats.accepted / done.stats.proposed < 0.7  # ~40 draws at 0.5 (seeded: the same each run)


def test_sampling_through_a_draft_aligned_by_hand_matches_the_target_distribution():
    """A misaligned position drafts from a shifted distribution, and that is the q the rule is given:
    the sampled output keeps the target's distribution exactly (tests/test_lossless_sampling.py's
    bounds, at this test's sample size). The draft is a copy of the target aligned at half its
    positions: accepted at all of those and, sampled over seven tokens, at some of the others (a
    shifted distribution still overlaps the target's)."""
    from test_lossless_sampling import (assert_same_distribution, exact_distribution, params_for,
                                        sample_distribution, tiny_model, word_tokenizer)

    from specserve.workers.sampling import SamplingParams
    from specserve.workers.engine import SpecEngine

    samples, sampling, tokenizer = 4_000, SamplingParams(temperature=1.0, top_p=0.9), word_tokenizer()
    engine = SpecEngine(tiny_model(0), tokenizer, {"d": tiny_model(0)})
    engine.simulate(SimConfig(alignment={"d": {ANY_TASK: 0.5}}))
    counts, alpha = sample_distribution(engine, params_for(sampling, 2), samples, "d")
    assert 0.5 < alpha < 0.95, "it should accept and reject, or the test proves little"
    assert_same_distribution(exact_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling,
                                                tokenizer.eos_token_id), counts, samples)
