"""The two test tiers: tests that use a heavy fixture are marked `slow`, and the default run leaves them out."""

import pytest

from tests.conftest import HEAVY_FIXTURES, pytest_collection_modifyitems


class Item:
    def __init__(self, *fixturenames: str):
        self.fixturenames = list(fixturenames)
        self.markers = []

    def add_marker(self, marker):
        self.markers.append(marker)


def test_a_test_using_a_heavy_fixture_is_marked_slow_and_others_are_not():
    heavy, light = Item("tmp_path", "embedded_model"), Item("tmp_path", "judge")
    pytest_collection_modifyitems(None, [heavy, light])
    assert [m.name for m in heavy.markers] == ["slow"] and light.markers == []
    assert {"embedded_model", "tiny_trainable", "one_varied_step"} <= HEAVY_FIXTURES


def test_this_run_selected_no_heavy_test_unless_asked_for_slow_ones(request):
    """In a default run (`-m "not slow"`, pyproject's addopts) no selected test uses a heavy fixture: conftest's
    marks are added before `-m` deselects."""
    if request.config.getoption("markexpr") != "not slow":
        pytest.skip("run with -m 'not slow' (the default) to check the default tier")
    items = request.session.items
    assert items and not [i.nodeid for i in items if HEAVY_FIXTURES & set(i.fixturenames)]
    assert not [i.nodeid for i in items if i.get_closest_marker("slow")]
