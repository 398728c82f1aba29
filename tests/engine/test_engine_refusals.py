"""A request the engine refuses is an error the caller can act on, never a hang or a dead engine."""

import pytest

from app.engine import EngineRejected, RequestStats
from tests.helpers.servers import collect


def test_a_token_id_outside_the_vocabulary_is_refused_and_the_engine_keeps_answering(engine, aio):
    with pytest.raises(EngineRejected) as exc:
        aio(collect(engine.stream([1, 2, 10**9], max_tokens=2)))
    assert str(exc.value).startswith("the model refused this request: ")
    assert engine.in_flight == 0 and engine.num_unfinished_requests() == 0
    events = aio(collect(engine.stream([1, 2, 3], max_tokens=2, ignore_eos=True)))
    assert isinstance(events[-1], RequestStats) and events[-1].output_tokens == 2
    assert aio(engine.health()).ok
