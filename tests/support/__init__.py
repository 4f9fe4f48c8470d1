"""Test support: paths, log capture, contract and process helpers.

The throwaway MariaDB and Redis servers live in :mod:`gorge_testing`, which
the benchmarks share; the session fixtures in ``tests/conftest.py`` start
one the first time a test asks for it.
"""
