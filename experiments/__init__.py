"""Levers that lost and one-off studies, each with its journal (experiments/README.md).

Code here may import `evoharness`; nothing under src/ imports it. Run a script from the repository
root as a module (``python -m experiments.<topic>.<script>``) and its tests with
``pytest experiments`` (they reuse tests/conftest.py's fixtures through experiments/conftest.py).
"""
