"""The report document of the recorded run folder (:data:`helpers.RECORDED_RUN`), built once per test module."""

from __future__ import annotations

import pytest

from helpers import RECORDED_RUN


@pytest.fixture(scope="module")
def doc() -> dict:
    from edgedeploy.report import build_report

    return build_report(RECORDED_RUN)
