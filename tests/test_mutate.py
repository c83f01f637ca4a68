"""The mutation check (tests/mutate.py) in CI's reach: ``make heavy`` runs it (``make mutate`` alone).

Each representative defect (a wrong constant in a decomposition, a dropped stride, a swapped
random parameter, an ignored ``decompositions=``, issue 50's planted ``normal``) is planted in a
pytest process of its own over the tests meant to catch it; each must fail at least one of them,
after a clean run in which they all pass. Minutes, so marked heavy.
"""

import pytest

from tests.mutate import MUTANTS, run


@pytest.mark.heavy
def test_every_planted_defect_is_caught_by_the_suite():
    caught = run()
    assert set(caught) == set(MUTANTS)
    missed = sorted(name for name, tests in caught.items() if not tests)
    assert not missed, f"planted defects no test caught: {missed}"
