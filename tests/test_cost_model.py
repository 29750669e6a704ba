"""The Leviathan et al. cost model against values worked by hand."""

import pytest

from specserve.router.cost_model import best_k, expected_speedup, expected_tokens_per_pass


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
