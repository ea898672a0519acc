"""Test helpers shipped with tiermem, for its own tests and for third-party backends.

The conformance suite checks any pair of stores against the storage contract. To run it on
your backend, define a ``backend`` fixture returning a :class:`BackendUnderTest` whose stores
use the fixture's :class:`~tiermem.clock.FakeClock`, then import the tests::

    # tests/test_my_backend.py
    import pytest
    from tiermem.testing import BackendUnderTest, FakeClock
    from tiermem.testing.conformance_hot import *      # noqa: F403
    from tiermem.testing.conformance_durable import *  # noqa: F403

    @pytest.fixture
    async def backend():
        clock = FakeClock()
        hot, durable = MyHotStore(clock=clock), MyDurableStore(clock=clock)
        yield BackendUnderTest(hot=hot, durable=durable, clock=clock)
        await hot.aclose(); await durable.aclose()

The tests use fresh random ids, so many tests can share one server.
"""

from tiermem.clock import FakeClock
from tiermem.testing.backend import BackendUnderTest

__all__ = ["BackendUnderTest", "FakeClock"]
