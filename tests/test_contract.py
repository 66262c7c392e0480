"""Every registered algorithm passes the common contract (placer.algorithms.checks)."""

import pytest

from placer.algorithms import available_algorithms
from placer.algorithms.checks import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("algorithm", available_algorithms())
def test_contract(algorithm, check):
    check(algorithm)
