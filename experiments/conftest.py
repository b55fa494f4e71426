"""The test suite's shared fixtures (tests/conftest.py: the micro model, the bundled games, the
teacher's SFT rows) for the experiments' tests, which live beside the code they test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(_TESTS) not in sys.path:  # tests/conftest.py's fixtures import its helpers (micro_model, engines)
    sys.path.insert(0, str(_TESTS))
_spec = importlib.util.spec_from_file_location("_evoharness_tests_conftest", _TESTS / "conftest.py")
_shared = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

model_dir = _shared.model_dir
valid_seen = _shared.valid_seen
teacher_examples = _shared.teacher_examples
