"""Harnesses for tests and benchmarks (fault injection, ...): importable by the test suite and ``bench/``, never
imported by slea itself. Importing a harness module may register things (``slea.testing.faulty_env`` registers the
env id ``slea/test-Faulty-v0``)."""
