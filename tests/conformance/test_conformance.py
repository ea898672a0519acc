"""The storage contract, checked on every backend with the same tests.

The ``backend`` fixture (tests/conftest.py) is parametrized over memory, sqlite, redis and
dynamodb; a backend whose server cannot be reached fails the run instead of skipping.
"""

from tiermem.testing.conformance_durable import *  # noqa: F403
from tiermem.testing.conformance_hot import *  # noqa: F403
from tiermem.testing.conformance_session import *  # noqa: F403
from tiermem.testing.conformance_shared import *  # noqa: F403
