"""The two test tiers (Makefile: `make test`, `make test-fast`): the fast tier's time limit fails an unmarked
slow test and leaves a marked one alone (tests/conftest.py), and the full tier never judges time."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SLEEPER = """
import time
import pytest

def test_unmarked():
    time.sleep(0.3)

@pytest.mark.slow
def test_marked():
    time.sleep(0.3)

def test_quick():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(
        "from tests.conftest import _LIMIT, _SPENT, pytest_configure, pytest_runtest_makereport  # noqa: F401\n"
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_sleeper=SLEEPER)
    return pytester


def test_the_fast_tier_fails_an_unmarked_slow_test(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LRKV_FAST_LIMIT_S", "0.1")
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_unmarked took * over LRKV_FAST_LIMIT_S=0.1: mark it @pytest.mark.slow*"]
    )


def test_the_full_tier_never_judges_time(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LRKV_FAST_LIMIT_S", raising=False)
    suite.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_a_limit_that_is_not_a_number_is_refused(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LRKV_FAST_LIMIT_S", "soon")
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    assert "LRKV_FAST_LIMIT_S='soon': give a number of seconds" in result.stdout.str() + result.stderr.str()
