"""The routing policy on synthetic statistics: expected speedup over alpha, exploration, fallback."""

from __future__ import annotations

import random

import pytest

from specserve.router.config import PolicyConfig
from specserve.router.cost_model import Load, PassFit, PassTime, best_k
from specserve.router.directory import WorkerDirectory
from specserve.router.load_check import LoadCheck, level
from specserve.router.policy import FALLBACK, MEASURED_SLOWER, SPECULATE, TARGET_SATURATED, Observation, Policy
from specserve.workers.registry import Endpoint

STEP = 0.010  # a target-only step: 10 ms


def observation(alpha: float, c: float, k: int = 4, steps: int = 50, verify_cost: float = 1.0) -> Observation:
    """`steps` verify steps at a per-token acceptance of exactly `alpha` in aggregate, drafting
    k tokens at c target steps each; a verify pass costs `verify_cost` target-only steps."""
    trials = steps * k
    accepted = round(alpha * trials)
    return Observation(accepted=accepted, rejections=trials - accepted, draft_tokens=steps * k,
                       draft_seconds=steps * k * c * STEP, verify_passes=steps,
                       verify_seconds=steps * verify_cost * STEP, verify_device_seconds=steps * verify_cost * STEP)


def plain(passes: int = 100) -> Observation:
    return Observation(plain_passes=passes, plain_seconds=passes * STEP, plain_device_seconds=passes * STEP)


# A batching replica: a pass of t tokens takes 10 ms + 1 ms per token (CPU-like: width is never free).
CPU_PASS = PassTime(fixed=0.010, per_token=0.001)


def batched_plain(line: PassTime = CPU_PASS, most_sessions: int = 64, k: int = 4) -> Observation:
    """Target-only steps of `plain()`, with the passes they ran in: of 1..most_sessions sessions,
    beside speculating neighbours (k + 1 tokens each) and target-only ones (1 token each)."""
    obs, fit = plain(), PassFit()
    for n in range(1, most_sessions + 1):
        for tokens in (n, n * (k + 1)):
            fit.add(tokens, line.seconds(tokens), n)
    obs.passes = fit
    return obs


def policy(drafts=("a", "b"), seed: int = 0, **config) -> Policy:
    return Policy(PolicyConfig(**config), {"t": tuple(drafts)}, random.Random(seed))


def test_picks_the_best_expected_speedup_not_the_best_alpha():
    p = policy(explore=False)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.8, c=0.9))  # accurate but as slow as the target
    p.observe("t", "b", observation(alpha=0.6, c=0.02))  # weaker but nearly free
    view = p.view("t")
    arms = {arm.draft: arm for arm in view.arms}
    assert arms["a"].alpha > arms["b"].alpha
    assert arms["a"].c == pytest.approx(0.9) and arms["b"].c == pytest.approx(0.02)
    assert view.best.draft == "b" and p.route("t").draft == "b"
    assert arms["b"].expected_speedup > 1 > arms["a"].expected_speedup


def test_k_follows_the_cost_model():
    p = policy(drafts=("a",), explore=False, k_max=16)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.9, c=0.01, steps=500))
    high = p.route("t").k
    p = policy(drafts=("a",), explore=False, k_max=16)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.5, c=0.2, steps=500))
    assert high > p.route("t").k >= 1


def test_explores_an_unseen_draft_and_then_drops_a_poor_one():
    p = policy(seed=1)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.6, c=0.05))  # "b" has no data at all
    routes = [p.route("t") for _ in range(200)]
    tried = [r for r in routes if r.draft == "b"]
    assert tried and all(r.reason == "explore" for r in tried)
    for _ in range(5):  # b turns out poor
        p.observe("t", "b", observation(alpha=0.1, c=0.05))
    later = sum(p.route("t").draft == "b" for _ in range(200))
    assert later < len(tried) / 2 and later <= 10


def test_a_requested_draft_or_k_wins_and_off_means_off():
    p = policy()
    assert p.route("t", draft="b", k=7) == p.route("t", draft="b", k=7)
    assert p.route("t", draft="b", k=7).reason == "requested" and p.route("t", draft="b", k=7).k == 7
    assert p.route("t", mode="off").draft is None
    # A draft the task does not allow serves the request that asks for it, and only that one.
    assert p.route("t", draft="z").draft == "z" and p.route("t", draft="z").k >= 1
    p.observe("t", "z", observation(alpha=0.99, c=0.01))
    assert {arm.draft for arm in p.view("t").arms} == {"a", "b"}


def test_falls_back_below_break_even_then_probes_and_returns_without_flapping():
    p = policy(drafts=("a",), seed=2, probe_fraction=0.1, min_trials=64)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.1, c=0.3, steps=10))  # 40 trials: too few to judge
    assert p.view("t").decision == SPECULATE and "waiting" in p.view("t").reason
    p.observe("t", "a", observation(alpha=0.1, c=0.3, steps=10))
    view = p.view("t")
    assert view.decision == FALLBACK and "< 1.0" in view.reason
    routes = [p.route("t") for _ in range(1000)]
    probes = sum(r.reason == "probe" for r in routes)
    assert sum(r.reason == "fallback" and r.draft is None for r in routes) == 1000 - probes
    assert 60 <= probes <= 140  # 10% probes, binomial(1000, 0.1) within ~3 sigma
    assert p.route("t", mode="on").draft == "a"  # a client asking for speculation gets it

    # Hovering between the thresholds changes nothing, in either state.
    borderline = observation(alpha=0.3, c=0.25, k=1)
    p2 = policy(drafts=("a",), explore=False)
    p2.observe("t", None, plain())
    for _ in range(20):
        p2.observe("t", "a", borderline)
        assert 1.0 <= p2.view("t").best.expected_speedup <= 1.1
    assert p2.view("t").decision == SPECULATE
    for _ in range(20):  # and in fallback, the same traffic does not bring it back
        p.observe("t", "a", borderline)
        assert p.view("t").decision == FALLBACK

    # A real recovery (probes now see a good draft) switches it back once, past resume_above.
    decisions = []
    for _ in range(20):
        p.observe("t", "a", observation(alpha=0.9, c=0.05))
        decisions.append((p.view("t").decision, p.view("t").reason))
    switch = next(i for i, (decision, _) in enumerate(decisions) if decision == SPECULATE)
    assert decisions[switch][1].startswith("recovered")
    assert all(decision == SPECULATE for decision, _ in decisions[switch:])
    assert p.route("t").draft == "a"


def test_full_information_scoring_moves_alpha_without_speculating():
    p = policy(explore=False)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.5, c=0.05))
    p.observe_scored("t", "b", positions=400, matches=360)  # b was never routed, only scored
    arms = {arm.draft: arm for arm in p.view("t").arms}
    assert arms["b"].alpha == pytest.approx(361 / 402) and arms["b"].scored_tokens == 400
    assert arms["b"].c == pytest.approx(0.05)  # no timings of its own: the typical draft's cost
    assert p.route("t").draft == "b"


def test_old_statistics_fade():
    p = policy(drafts=("a",), explore=False, half_life_tokens=200, min_trials=0)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.9, c=0.05, steps=100))
    for _ in range(5):
        p.observe("t", "a", observation(alpha=0.1, c=0.05, steps=10))
    # One half-life on, the old 400 trials weigh 200 against ~154 new ones (faded as they came):
    # (180 + 15 + 1) / (354 + 2).
    assert p.view("t").best.alpha == pytest.approx(0.55, abs=0.01)
    for _ in range(45):
        p.observe("t", "a", observation(alpha=0.1, c=0.05, steps=10))
    assert p.view("t").best.alpha < 0.12  # ten half-lives later they are gone


def test_saturation_judges_the_target_work_per_token():
    # A slow draft: a loss when the client waits for it, but with the target saturated its time
    # hides behind other requests' verification.
    p = policy(drafts=("a",), explore=False, saturated_sessions=8, min_trials=0)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.5, c=1.0, k=2, steps=200))
    assert p.view("t").decision == FALLBACK
    p.route("t", pressure=12)
    p.observe("t", "a", Observation())
    view = p.view("t")
    assert view.decision == SPECULATE and "target saturated" in view.reason

    # Under batch pressure a verify pass costs more per token (w): then even saturated it loses.
    p = policy(drafts=("a",), explore=False, saturated_sessions=8, min_trials=0)
    p.observe("t", None, plain())
    p.route("t", pressure=12)
    p.observe("t", "a", observation(alpha=0.5, c=0.01, k=4, steps=200, verify_cost=5.0))
    view = p.view("t")
    assert view.decision == FALLBACK and "target saturated" in view.reason


def test_config_refuses_thresholds_that_would_flap():
    with pytest.raises(ValueError, match="resume_above"):
        PolicyConfig(fallback_below=1.1, resume_above=1.0)
    with pytest.raises(ValueError, match="k_min"):
        PolicyConfig(k_min=5, k_max=4)


def test_per_position_acceptance_is_kept_for_each_draft():
    p = policy(drafts=("a",))
    obs = observation(alpha=0.5, c=0.05, k=2, steps=4)
    obs.accepted_per_position, obs.tested_per_position = [3, 1, 0], [4, 3, 0]  # no step reached position 2
    p.observe("t", "a", obs)
    assert p.view("t").arms[0].alpha_per_position == pytest.approx((0.75, 1 / 3))


def load_policy(**config) -> Policy:
    """One draft at alpha 0.8, c 0.05, on the batching replica above, known well enough to judge."""
    p = policy(drafts=("a",), explore=False, probe_fraction=0, min_trials=0, **config)
    p.observe("t", None, batched_plain())
    p.observe("t", "a", observation(alpha=0.8, c=0.05, steps=500))
    return p


def test_k_falls_as_sessions_share_a_pass():
    p = load_policy()
    routes = [p.route("t", pressure=n) for n in (1, 2, 4, 8, 16)]
    ks = [r.k for r in routes]
    assert ks == sorted(ks, reverse=True) and ks[0] - ks[-1] >= 3, ks  # a real slope
    assert routes[0].load == "" and all(r.load == "lowered_k" for r in routes[2:])
    assert all(r.draft == "a" for r in routes) and p.view("t").decision == SPECULATE
    alpha = p.view("t").best.alpha
    assert ks[-1] == best_k(alpha, 0.05, 1, 8, Load(16, p.passes.line(), saturated=True))[0]


def test_falls_back_when_passes_are_full_and_speculates_again_as_the_load_falls():
    p = load_policy()
    route = p.route("t", pressure=64)
    view = p.view("t")
    assert route.draft is None and route.reason == "fallback" and route.load == TARGET_SATURATED
    assert view.decision == FALLBACK and view.cause == TARGET_SATURATED
    # "target_saturated: at 64.0 sessions per pass a step of k=1 costs 1.86 target steps: ..."
    assert view.reason.startswith(f"{TARGET_SATURATED}: at 64.0 sessions per pass a step of k=1 costs 1.8"), view.reason
    assert view.best.unloaded_speedup > 2  # the same draft unloaded: the load alone made it lose
    on = p.route("t", mode="on", pressure=64)
    assert on.draft == "a" and on.k >= 1  # a request that asks for speculation still drafts
    assert p.route("t", pressure=40).draft is None  # between the thresholds: hysteresis holds it
    back = p.route("t", pressure=2)
    assert back.draft == "a" and back.k >= 4 and p.view("t").reason.startswith("recovered")


def test_a_replica_that_does_not_batch_caps_the_load():
    # Its passes hold one session: a step's price does not grow with the router's sessions.
    p = policy(drafts=("a",), explore=False, min_trials=0)
    p.pass_cap = 1
    p.observe("t", None, batched_plain(most_sessions=1))
    p.observe("t", "a", observation(alpha=0.8, c=0.05, steps=500))
    route = p.route("t", pressure=32)
    assert p.view("t").load.sessions == 1 and route.draft == "a" and p.view("t").decision == SPECULATE


def test_light_passes_do_not_hide_the_load():
    # Speculating sessions sit out passes while they draft: passes of a few sessions lately must not
    # make 64 sessions per replica look like a few.
    p = policy(drafts=("a",), explore=False, min_trials=0)
    p.pass_cap = 64
    p.observe("t", None, batched_plain(most_sessions=4))
    p.observe("t", "a", observation(alpha=0.8, c=0.05, steps=500))
    p.route("t", pressure=64)
    assert p.view("t").load.sessions == 64 and p.view("t").decision == FALLBACK


def test_a_verify_steps_wait_beyond_its_pass_is_priced():
    """Target-only tokens come in decode runs and wait for their passes alone; a verify step also
    waits out a round trip and the pass under way (r): at a wait of two target steps beyond its
    pass, a draft that pays without it does not."""
    cheap, waiting = observation(alpha=0.6, c=0.05, k=2, steps=500), observation(alpha=0.6, c=0.05, k=2, steps=500)
    waiting.verify_seconds += 2 * 500 * STEP  # two target-only steps more per verify step, on the wall only
    views = []
    for obs in (cheap, waiting):
        p = policy(drafts=("a",), explore=False, min_trials=0)
        p.observe("t", None, plain())
        p.observe("t", "a", obs)
        views.append(p.view("t"))
    assert views[0].decision == SPECULATE and views[0].best.expected_speedup > 1.2
    assert views[1].decision == FALLBACK
    assert views[1].best.step_cost == pytest.approx(1 + 2 + 0.05 * views[1].best.k)  # verify + r + k c


def test_without_pass_data_the_load_changes_nothing_but_saturation():
    p = policy(drafts=("a",), explore=False, min_trials=0)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.8, c=0.05, steps=500))
    assert p.passes.line() is None
    unloaded = p.route("t", pressure=1)
    assert p.route("t", pressure=4) == unloaded and unloaded.load == ""
    view = p.view("t")
    assert "with no pass timings yet" in view.reason and view.best.step_cost == pytest.approx(1 + 0.05 * view.best.k)


def test_the_directory_caps_the_load_at_what_a_replica_pass_holds():
    directory = WorkerDirectory(registry=None, failed_cooldown=1.0)
    directory.endpoints = [Endpoint("target", "t0", "a:1", pass_sessions=32), Endpoint("target", "t1", "a:2", pass_sessions=1),
                           Endpoint("draft", "d0", "a:3", pass_sessions=64)]
    directory.load.update({"t0": 30, "t1": 10, "d0": 40})
    assert directory.target_pressure() == 20 and directory.target_pass_cap() == 1
    directory.endpoints = directory.endpoints[:1] + [Endpoint("target", "t2", "a:4")]  # one that does not say
    assert directory.target_pass_cap() == 32


def test_drafting_hides_only_behind_sessions_that_queue():
    # A slow draft at 12 sessions per replica: with passes of 8, sessions queue and drafting hides;
    # with passes of 32 every session is in every pass it is ready for, and drafting is its own time.
    decisions = {}
    for cap in (8, 32):
        p = policy(drafts=("a",), explore=False, min_trials=0)
        p.pass_cap = cap
        p.observe("t", None, plain())
        p.observe("t", "a", observation(alpha=0.5, c=1.0, k=2, steps=200))
        p.route("t", pressure=12)
        decisions[cap] = (p.view("t").decision, p.view("t").load.saturated)
    assert decisions == {8: (SPECULATE, True), 32: (FALLBACK, False)}



def test_load_check_compares_a_proposer_with_target_only_requests_at_the_nearest_level_measured():
    check = LoadCheck(min_requests=2)
    for _ in range(2):
        check.record("sql", "d", 8, 100, 10.0)  # 10 tokens/s speculating at 8-15 sessions per replica
        check.record("code", None, 9, 100, 2.5)  # 40 target-only, whatever the task
        check.record("sql", "d", 1, 100, 1.0)
    assert check.ratio("sql", "d", 12) == pytest.approx(0.25) and check.ratio("sql", "d", 40) == pytest.approx(0.25)
    assert check.ratio("sql", "d", 1) is None  # no target-only requests alone yet
    check.record("math", None, 1, 100, 1.25)
    assert check.ratio("sql", "d", 1) is None  # one is not enough to count
    check.record("prose", None, 1, 100, 1.25)
    assert check.ratio("sql", "d", 3) == pytest.approx(1.25)
    assert check.ratio("math", "d", 12) is None and check.ratio("sql", "e", 12) is None  # nothing speculated
    assert level(1) == level(1.9) == 0 and level(2) == 1 and level(15.9) == 3


def test_speculation_stops_where_it_ran_slower_whatever_the_model_expects():
    p = policy(drafts=("a",), explore=False, min_trials=0, probe_fraction=0, measured_min_requests=4)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.9, c=0.05, steps=500))  # the model expects a large speedup
    assert p.route("t", pressure=8).draft == "a"
    for _ in range(4):  # what requests at 8 sessions per replica really got
        p.observe("t", "a", Observation(draft_tokens=40, tokens=96, seconds=8.0, pressure=8))
        p.observe("t", None, Observation(tokens=96, seconds=2.4, pressure=9))
    for pressure in (8, 16):
        route = p.route("t", pressure=pressure)
        assert route.draft is None and route.load == MEASURED_SLOWER
    assert p.route("t", pressure=1).draft == "a"  # nothing measured there: the model decides
    assert p.route("t", mode="on", pressure=8).draft == "a"  # a request that asks for speculation drafts


def test_a_proposer_that_ran_slower_is_passed_over_for_one_that_did_not():
    """Per proposer, not per task: the task's poor draft ran slower, prompt lookup did not."""
    p = policy(drafts=("a", "b"), explore=False, min_trials=0, probe_fraction=0, measured_min_requests=2)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.9, c=0.05, steps=500))  # the model prefers a
    p.observe("t", "b", observation(alpha=0.7, c=0.05, steps=500))
    for _ in range(2):
        p.observe("t", "a", Observation(draft_tokens=40, tokens=96, seconds=8.0, pressure=1))
        p.observe("t", "b", Observation(draft_tokens=40, tokens=96, seconds=1.0, pressure=1))
        p.observe("t", None, Observation(tokens=96, seconds=2.4, pressure=1))
    route = p.route("t", pressure=1)
    assert route.draft == "b" and route.reason == "best"


def test_priors_start_a_task_with_losing_drafts_target_only_and_one_with_a_good_draft_speculating():
    """The zoo's held-out acceptance counts as `prior_trials` trials: no request is spent learning
    what was measured before serving."""
    tasks = {"prose": ("weak",), "sql": ("strong",)}
    p = Policy(PolicyConfig(probe_fraction=0.0), tasks, random.Random(0),
               priors={"prose": {"weak": 0.1}, "sql": {"strong": 0.9}})
    assert p.view("prose").decision == FALLBACK and p.route("prose").draft is None
    assert p.view("sql").decision == SPECULATE and p.route("sql").draft == "strong"
    assert p.view("sql").best.trials == PolicyConfig().prior_trials
    unprimed = Policy(PolicyConfig(probe_fraction=0.0), tasks, random.Random(0))
    assert unprimed.route("prose").draft == "weak"  # without the prior it would find out on requests


def test_a_draft_free_proposer_starts_unchosen_and_scoring_brings_it_in_at_no_cost():
    p = Policy(PolicyConfig(), {"t": ("d", "suffix")}, random.Random(0), priors={"t": {"d": 0.6}})
    p.observe("t", None, plain())
    arms = {arm.draft: arm for arm in p.view("t").arms}
    assert arms["suffix"].alpha < 0.05 and arms["suffix"].c == 0.0  # free, but not yet trusted
    assert sum(p.route("t").draft == "suffix" for _ in range(100)) < 10
    for _ in range(5):  # full information on five 100-token answers it would have matched 90% of
        p.observe_scored("t", "suffix", 100, 90)
    view = p.view("t")
    assert view.best.draft == "suffix" and view.best.c == 0.0 and view.best.k == PolicyConfig().k_max
    assert sum(p.route("t").draft == "suffix" for _ in range(100)) > 90


def test_a_proposer_is_priced_by_how_often_it_proposes():
    """A lookup that proposes on a third of the steps and is right when it does: those steps are
    speculative ones, the others one-token passes costing what target-only steps cost."""
    from specserve.router.cost_model import speedup_at

    load = Load(w=0.2)
    assert speedup_at(0.9, 0.0, 4, load, coverage=0.0) == pytest.approx(1.0)
    third = speedup_at(0.9, 0.0, 4, load, coverage=1 / 3)
    assert 1.0 < third < speedup_at(0.9, 0.0, 4, load)
    assert third == pytest.approx((4.0951 / 3 + 2 / 3) / (1.8 / 3 + 2 / 3), rel=1e-3)
    p = Policy(PolicyConfig(explore=False), {"t": ("d", "ngram")}, random.Random(0))
    p.observe("t", None, plain())
    p.observe("t", "d", observation(alpha=0.5, c=0.2, steps=200))
    for _ in range(20):  # proposes at 40 of 100 positions, right at 36 of them
        p.observe_scored("t", "ngram", 100, 36, proposed=40)
    arms = {arm.draft: arm for arm in p.view("t").arms}
    assert arms["ngram"].alpha == pytest.approx(0.9, abs=0.1)  # its prior (0, 64 trials) fades
    assert p._tasks["t"].arms["ngram"].coverage == pytest.approx(0.4, abs=0.05)
    assert p.view("t").best.draft == "ngram"


def test_the_replicas_start_up_timings_price_the_first_burst_at_its_load():
    """Before any request has run, the pass curve comes from the target replicas' start-up timings
    (workers/calibration.py, through their registrations), so a burst's first requests get the k
    of their load; timings of real passes fold in over them, and a second seeding is ignored."""
    timed = tuple((t, CPU_PASS.seconds(t)) for t in (1, 2, 4, 8, 16, 32, 64, 128))
    p = policy(drafts=("a",), explore=False, min_trials=0)
    p.observe("t", None, plain())
    p.observe("t", "a", observation(alpha=0.8, c=0.05, steps=500))  # requests that timed no pass
    assert p.route("t", pressure=16).load == ""  # no pass timed: the load changes nothing
    p.seed_passes(timed)
    ks = [p.route("t", pressure=n).k for n in (1, 4, 16)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1], ks
    assert p.passes.curve().seconds(40) == pytest.approx(CPU_PASS.seconds(40))
    weight = p.passes.weight
    p.seed_passes(tuple((t, 10 * s) for t, s in timed))
    assert p.passes.weight == weight


def test_a_replica_times_a_pass_of_each_width_at_start_up(tiny_engine):
    from specserve.workers.batching import Scheduler
    from specserve.workers.calibration import WIDTHS, time_pass_widths
    from specserve.workers.config import BatchingConfig
    from specserve.workers.grpc_host import Device
    from specserve.workers.kv_pool import Budget, KVPool, KVShape

    pool = KVPool(KVShape.of(tiny_engine.target), Budget(2**26))
    scheduler = Scheduler(tiny_engine.target, pool, Device(1), BatchingConfig(max_tokens_per_pass=64))
    timed = time_pass_widths(scheduler)
    assert [t for t, _ in timed] == [w for w in WIDTHS if w <= 64] and all(s > 0 for _, s in timed)
    assert pool.in_use == 0  # its region went back


def test_the_directory_gives_the_slowest_replicas_timing_per_width():
    directory = WorkerDirectory(registry=None, failed_cooldown=1.0)
    directory.endpoints = [Endpoint("target", "t0", "a:1", pass_times=((1, 0.01), (2, 0.02))),
                           Endpoint("target", "t1", "a:2", pass_times=((1, 0.03),)), Endpoint("target", "t2", "a:3"),
                           Endpoint("draft", "d0", "a:4", pass_times=((1, 9.0),))]
    assert directory.target_pass_times() == ((1, 0.03), (2, 0.02))


def test_the_learning_budget_holds_learning_to_its_share_of_a_core():
    from specserve.router.learning_budget import BURST_SECONDS, LearningBudget

    now = [0.0]
    budget = LearningBudget(0.02, clock=lambda: now[0])

    def job(seconds: float):
        def run():
            now[0] += seconds
        return run

    # Idle, it has saved up a burst: jobs run until it is spent...
    assert sum(budget.run(job(0.01)) for _ in range(10)) == round(BURST_SECONDS / 0.01)
    # ...then one 10 ms job per 0.5 s of the clock: 2% of a core.
    ran = 0
    for _ in range(1000):  # 10 s of requests every 10 ms
        now[0] += 0.01
        ran += budget.run(job(0.01))
    assert ran == pytest.approx(10 / 0.5, abs=2)
    assert not LearningBudget(0.0, clock=lambda: now[0]).run(job(0.001))  # 0: learning off


def test_medusa_heads_are_priced_with_no_drafting_time_of_their_own_from_the_start():
    """They guess in the verify pass: c 0 before any timing (a draft model starts at the prior c),
    and their c stays out of the typical c other drafts are priced at."""
    tasks = {"t": ("d", "m")}
    p = Policy(PolicyConfig(probe_fraction=0.0), tasks, random.Random(0), priors={"t": {"d": 0.7, "m": 0.7}},
               on_verifier=frozenset({"m"}))
    arms = {arm.draft: arm for arm in p.view("t").arms}
    assert arms["m"].c == 0.0 and arms["d"].c == PolicyConfig().prior_cost_ratio
    assert arms["m"].expected_speedup > arms["d"].expected_speedup and p.route("t").draft == "m"
