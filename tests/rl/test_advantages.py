import statistics

import pytest

from rl.advantages import group_advantages


def counts() -> dict[str, int]:
    return {"errored": 0, "timed_out": 0, "zero_advantage_groups": 0}


def test_the_advantage_is_the_reward_minus_the_group_mean_without_std_normalisation():
    c = counts()
    assert group_advantages([1.0, 0.0, 0.0, 0.0], c) == [0.75, -0.25, -0.25, -0.25]
    assert c == counts()


def test_a_rollout_at_the_group_mean_trains_nothing():
    c = counts()
    assert group_advantages([1.0, 0.5, 0.0], c) == [0.5, None, -0.5]
    assert c == counts()  # the group still trains


def test_a_group_of_equal_rewards_trains_nothing_and_is_counted():
    c = counts()
    assert group_advantages([0.5, 0.5, 0.5], c) == [None, None, None]
    assert group_advantages([0.1, 0.1, 0.1], c) == [None, None, None]  # a mean one ulp off is still zero
    assert c == {**counts(), "zero_advantage_groups": 2}


def test_an_errored_rollout_is_left_out_of_the_mean_and_of_training_and_counted():
    c = counts()
    # with the errored rollout's would-be 0 in the mean, the others would be 2/3 and -1/3
    assert group_advantages([1.0, "errored", 0.0], c) == [0.5, None, -0.5]
    assert c == {**counts(), "errored": 1}


def test_a_timed_out_rollout_is_counted_apart_from_the_errored():
    c = counts()
    assert group_advantages(["timed_out", 1.0, 1.0], c) == [None, None, None]  # the rest scored alike
    assert c == {"errored": 0, "timed_out": 1, "zero_advantage_groups": 1}


def test_a_single_member_group_has_nothing_to_compare_with():
    c = counts()
    assert group_advantages([0.9], c) == [None]
    assert group_advantages(["errored", 0.3], c) == [None, None]
    assert c == {"errored": 1, "timed_out": 0, "zero_advantage_groups": 2}


def test_a_group_with_nothing_scored_is_counted_only_by_its_rollouts():
    c = counts()
    assert group_advantages(["errored", "timed_out"], c) == [None, None]
    assert c == {"errored": 1, "timed_out": 1, "zero_advantage_groups": 0}


def test_std_normalisation_is_asked_for_explicitly():
    rewards = [1.0, 0.0, 0.0, "errored", 0.0]
    scored = [1.0, 0.0, 0.0, 0.0]
    std = statistics.pstdev(scored)
    normalised = group_advantages(rewards, counts(), std_normalize=True)
    assert normalised[3] is None
    assert [a for a in normalised if a is not None] == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std,
                                                                      -0.25 / std])
    assert group_advantages([0.5, 0.5], counts(), std_normalize=True) == [None, None]  # no division by zero
