"""Which ALFWorld engine a test plays on: the fast engine (the default), or
``$EVOHARNESS_TEST_ENGINE`` (e.g. ``textworld`` to run a test on the stock engine)."""

import os


def pick_engine(task=None) -> str:
    return os.environ.get("EVOHARNESS_TEST_ENGINE", "fast")
