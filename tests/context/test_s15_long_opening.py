"""Review of session 15 (R2): a long task request does not crowd out the task's own turns.

fdc4996 puts a loop's opening user turn, read back from the archive, first in the window
and never evicts it. A request with a pasted document (8k tokens here) was kept whole (cut
only to the whole budget): the window held it and the loop's last tool pair, evicting
the other 18 hot turns the model was continuing from. The opening now takes at most a
quarter of the hot share (``OPENING_SHARE``), cut with a marker (``session.get_turn``
returns it whole), and its marker of the turns not shown stays. Fails on 616e800.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.context.test_s15_loop_opening import REQUEST, _add_pair, _check_anthropic, _service
from tests.integration.conftest import open_composed_pairing
from tiermem.context.assemble import OPENING_SHARE
from tiermem.context.models import Allocation

SCHEMA = "\n".join(
    f"CREATE TABLE t{i} (id int, name text, amount numeric, created timestamptz);"
    for i in range(400)
)


@pytest.mark.parametrize("budget", [3000, 8000])
async def test_a_long_request_leaves_the_loop_its_hot_turns(budget: int, tmp_path: Path) -> None:
    async with open_composed_pairing("memory+memory", tmp_path) as pairing:
        memory = _service(pairing, summaries=False)
        session = await memory.session(user_id="u-long")
        await session.add_turn("user", f"{REQUEST} The schema:\n{SCHEMA}")
        for i in range(40):
            await _add_pair(session, i)
        await memory.drain()
        window = await session.context(budget=budget)
        _check_anthropic(window)
        opening, *turns = [i for i in window.items if i.kind == "turn"]
        assert opening.provenance.turn_indexes == (0,)
        assert opening.truncated
        assert opening.tokens <= math.floor(budget * Allocation().hot) // OPENING_SHARE
        assert "truncated to fit the context budget" in opening.text
        assert opening.text.endswith(
            "[turns 1-60 of this task are not shown; session.get_turn(i) returns turn i.]"
        )
        # Every hot turn (the last 20: ten whole pairs) is still there.
        assert [t.provenance.turn_indexes[0] for t in turns] == list(range(61, 81))
        assert window.stats.evicted_count == 0
