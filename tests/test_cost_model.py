"""The Leviathan et al. cost model, priced with the pass a step runs in, against values worked by hand."""

import pytest

from specserve.router.cost_model import (Load, PassFit, PassTime, best_k, expected_speedup, expected_tokens_per_pass,
                                         speedup_at)


def test_tokens_per_pass():
    assert expected_tokens_per_pass(0.0, 4) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens_per_pass(1.0, 4) == 5.0  # everything accepted plus the bonus token
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_speedup():
    # alpha 0.8, k 4: E = (1 - 0.8^5) / 0.2 = 3.3616; with c = 0.05 the cost is 1.2 target steps.
    assert expected_speedup(0.8, 0.05, 4) == pytest.approx(3.3616 / 1.2)
    assert expected_speedup(0.0, 0.1, 3) < 1  # a useless draft only costs


@pytest.mark.parametrize("alpha,c,k", [(-0.1, 0.1, 2), (1.1, 0.1, 2), (0.5, -1, 2), (0.5, 0.1, -1)])
def test_refuses_values_outside_the_model(alpha, c, k):
    with pytest.raises(ValueError):
        expected_speedup(alpha, c, k)


def test_wider_verify_passes_and_saturation():
    # Each verified token adding 5% of a step: alpha 0.8, k 4, c 0.05 -> 3.3616 / (1 + 0.2 + 0.2).
    assert expected_speedup(0.8, 0.05, 4, w=0.05) == pytest.approx(3.3616 / 1.4)
    # Saturated, the draft's cost drops out and only the target's work remains.
    assert expected_speedup(0.8, 0.05, 4, w=0.05, saturated=True) == pytest.approx(3.3616 / 1.2)


def test_best_k():
    k, speedup = best_k(0.8, 0.05, 1, 16)
    assert speedup == max(expected_speedup(0.8, 0.05, j) for j in range(1, 17))
    assert 3 <= k <= 8  # Leviathan et al., fig. 3: the optimum for alpha 0.8 and c 0.05 lies here
    assert best_k(0.3, 0.5, 1, 8)[0] == 1  # a poor, expensive draft: draft as little as possible
    assert best_k(0.99, 0.0, 1, 8)[0] == 8  # a free, near-perfect draft: as many as allowed


# A pass of t tokens takes 10 ms + 1 ms per token: a CPU-like target, where width is never free.
CPU_PASS = PassTime(fixed=0.010, per_token=0.001)


def test_a_step_is_priced_with_the_pass_it_runs_in():
    # N = 1, k = 4: a pass of 5 tokens over one of 1, plus drafting: the paper's 1 + k w + k c, w = b / (a + b).
    assert Load(1, CPU_PASS).step_cost(4, 0.05) == pytest.approx(15 / 11 + 0.2)
    assert Load(1, CPU_PASS).step_cost(4, 0.05) == pytest.approx(Load(w=1 / 11).step_cost(4, 0.05))
    # 16 sessions: one pass of 80 tokens instead of one of 16, and the draft hidden when saturated.
    assert Load(16, CPU_PASS, saturated=True).step_cost(4, 0.05) == pytest.approx(90 / 26)
    assert speedup_at(0.8, 0.05, 4, Load(16, CPU_PASS)) == pytest.approx(3.3616 / (90 / 26 + 0.2))


def test_k_falls_as_the_load_grows_until_no_k_pays():
    ks, speedups = zip(*(best_k(0.8, 0.05, 1, 8, Load(n, CPU_PASS)) for n in (1, 2, 4, 8, 16, 32, 64)), strict=True)
    assert list(ks) == sorted(ks, reverse=True) and ks[0] >= 4 and ks[-1] == 1  # a real slope, not a step
    assert speedups[0] > 2 and speedups[-1] < 1  # compute-bound passes: target-only wins
    # A memory-bound target (a GPU at small batches): the same load leaves speculation worth a lot more.
    gpu = PassTime(fixed=0.020, per_token=0.0001)
    assert best_k(0.8, 0.05, 1, 8, Load(16, gpu))[0] > best_k(0.8, 0.05, 1, 8, Load(16, CPU_PASS))[0]


def test_without_pass_data_the_load_is_only_saturation():
    for n in (1, 16):
        assert Load(n, None, w=0.05).step_cost(4, 0.05) == pytest.approx(1.4)
    assert best_k(0.8, 0.05, 1, 8, Load(16, None, w=0.05)) == best_k(0.8, 0.05, 1, 8, Load(w=0.05))


def fitted(line: PassTime, sizes, sessions: int = 1) -> PassFit:
    fit = PassFit()
    for t in sizes:
        fit.add(t, line.seconds(t), sessions)
    return fit


def test_the_pass_fit_finds_the_line_and_follows_a_change():
    line = fitted(CPU_PASS, range(1, 65)).line()
    assert line.fixed == pytest.approx(0.010) and line.per_token == pytest.approx(0.001)
    assert fitted(CPU_PASS, [5] * 100).line() is None  # one size only: the slope is unknown
    assert fitted(CPU_PASS, [1, 5] * 3).line() is None  # too few passes
    assert fitted(CPU_PASS, [0, 0] * 20).line() is None  # workers that report no pass teach nothing
    # Ten half-lives later the old replica is forgotten.
    fit = fitted(CPU_PASS, range(1, 65))
    fit.fold(fitted(PassTime(0.002, 0.0001), range(1, 65)), factor=0.5 ** 10)
    assert fit.line().fixed == pytest.approx(0.002, rel=0.05) and fit.line().per_token == pytest.approx(0.0001, rel=0.1)
    # Superlinear passes would give a negative intercept: then the line goes through the origin.
    fit = PassFit()
    for t in (10, 20, 40) * 3:
        fit.add(t, 1e-6 * t * t, 1)
    assert fit.line().fixed == 0 and fit.line().per_token == pytest.approx(73_000e-6 / 2_100)  # sum t s / sum t^2



def widths_fit(seconds_by_width: dict[int, float], repeats: int = 4) -> PassFit:
    fit = PassFit()
    for _ in range(repeats):
        for width, seconds in seconds_by_width.items():
            fit.add(width, seconds, 1)
    return fit


def test_the_curve_prices_each_width_by_its_own_passes():
    """On a CPU a 2- or 3-row output head costs more than a 4-row one (SmolLM2's head, ms: 9.6, 22.9,
    34.4, 17.2 for 1-4 rows): a line through those passes prices none of them right, the curve
    prices each as seen, straight between widths seen, and by the line beyond them."""
    seen = {1: 0.0096, 2: 0.0229, 3: 0.0344, 4: 0.0172, 8: 0.0300}
    fit = widths_fit(seen)
    curve, line = fit.curve(), fit.line()
    for width, seconds in seen.items():
        assert curve.seconds(width) == pytest.approx(seconds)
    assert abs(line.seconds(4) - seen[4]) > 0.005  # what the line alone would have said
    assert curve.seconds(6) == pytest.approx((seen[4] + seen[8]) / 2)  # between two widths seen
    assert curve.seconds(40) == pytest.approx(line.seconds(40))  # beyond them: the line
    assert widths_fit(seen, repeats=2).curve().points == ()  # too few passes of each width: the line alone
    assert (curve.fixed, curve.per_token) == (line.fixed, line.per_token)  # what reports show of it


def test_on_a_gpu_where_width_is_free_the_curve_lets_k_grow():
    """An H100's pass costs the same for 1 to 16 tokens (3.2-4.6 ms): the curve prices a verify
    pass of k + 1 like a one-token pass, where a line through a wide pass charges every token."""
    fit = widths_fit({1: 0.0032, 2: 0.0032, 5: 0.0033, 9: 0.0034, 64: 0.0210})
    curve, line = fit.curve(), fit.line()
    assert curve.verify_cost(4, 1) == pytest.approx(0.0033 / 0.0032)
    assert line.verify_cost(4, 1) > 1.05
    assert best_k(0.7, 0.02, 1, 8, Load(1, curve))[0] > best_k(0.7, 0.02, 1, 8, Load(1, line))[0]


def test_the_curve_fades_with_the_line():
    fit = widths_fit({1: 0.010, 5: 0.030})
    fit.fold(widths_fit({1: 0.002, 5: 0.004}), factor=0.5 ** 10)  # the replica was replaced by a faster one
    assert fit.curve().seconds(1) == pytest.approx(0.002, rel=0.01)
    assert fit.curve().seconds(5) == pytest.approx(0.004, rel=0.01)
    assert PassFit().curve() is None  # no passes: no curve (the policy prices by w)
