"""The Leviathan et al. cost model against values worked by hand."""

import pytest

from specserve.router.cost_model import expected_speedup, expected_tokens_per_pass


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
