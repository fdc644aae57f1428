import math

import pytest

from ruler_rl import group_advantages
from ruler_rl.advantages import group_has_signal


def test_scaled_advantages_are_zero_mean_unit_std():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert sum(adv) == pytest.approx(0, abs=1e-9)
    assert math.sqrt(sum(a * a for a in adv) / 4) == pytest.approx(1, rel=1e-4)
    assert adv[0] > adv[2] == adv[3] > adv[1]


def test_unscaled_is_reward_minus_mean():
    assert group_advantages([1.0, 0.0], scale=False) == [0.5, -0.5]


def test_equal_rewards_carry_no_signal():
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert not group_has_signal([0.3, 0.3]) and not group_has_signal([1.0]) and group_has_signal([0, 1])


def test_empty_and_bad_rewards():
    assert group_advantages([]) == []
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(TypeError, match="not a number"):
        group_advantages([1.0, "high"])
