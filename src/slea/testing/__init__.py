"""Harnesses for tests, benchmarks and studies (fault injection, ...): importable by the test suite, ``bench/`` and
``experiments/``, never imported by slea itself. Importing a harness module may register things
(``slea.testing.faulty_env`` registers the env id ``slea/test-Faulty-v0``)."""
