"""Fixtures of the Keras tests: tf_keras (the Keras the tree trains with) and Keras 3 (what users save)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def keras():
    """tf_keras, loaded the one way edgedeploy loads it."""
    from edgedeploy.keras import tfenv

    return tfenv.load().keras


@pytest.fixture(scope="module")
def tf_keras(keras):
    return keras


@pytest.fixture(scope="module")
def keras3(tf_keras):
    """Keras 3, whatever TF_USE_LEGACY_KERAS says (loaded after tf_keras, as a user's process has both)."""
    import keras as keras3_module

    assert keras3_module.__version__.startswith("3")
    return keras3_module
