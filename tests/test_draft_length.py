"""The adaptive-k schedules."""

from specserve.workers.draft_length import DraftLength


def test_heuristic_is_hugging_faces():
    length = DraftLength("heuristic", k=4, k_max=8)
    length.update(proposed=4, accepted=4)
    assert length.k == 6
    length.update(proposed=6, accepted=6)
    assert length.k == 8  # capped at k_max
    length.update(proposed=8, accepted=2)
    assert length.k == 7
    for _ in range(10):
        length.update(proposed=length.k, accepted=0)
    assert length.k == 1  # never below one
    length.update(proposed=0, accepted=0)  # a target-only step says nothing
    assert length.k == 1


def test_fixed_and_confidence_keep_k_and_only_confidence_sets_a_threshold():
    for schedule, threshold in (("fixed", 0.0), ("confidence", 0.4)):
        length = DraftLength(schedule, k=4, k_max=8, confidence_threshold=0.4)
        length.update(proposed=4, accepted=4)
        length.update(proposed=4, accepted=0)
        assert length.k == 4 and length.min_confidence == threshold


def test_the_most_a_step_may_ask_for_is_k_max_only_where_k_moves_up_to_it():
    assert DraftLength("heuristic", k=4, k_max=8).most == 8
    assert DraftLength("fixed", k=4, k_max=8).most == 4
    assert DraftLength("confidence", k=4, k_max=8, confidence_threshold=0.4).most == 4
