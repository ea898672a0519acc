"""The test suite. Hypothesis runs without its per-example deadline (200 ms by default):
a deadline is a wall-clock assertion, and on a shared 2-core machine an example can take
longer for reasons that are not the code's. Speed is measured by the benchmarks in
``bench/``, never asserted by a test. Loaded here, before any test module builds its
``@settings``, so every test inherits it."""

from hypothesis import HealthCheck, settings

settings.register_profile("tiermem", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tiermem")
