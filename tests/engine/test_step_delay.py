"""The engine's pause after each step (app/engine/step_delay.py), which tests use for answers they can
catch mid-stream: only the answers that ask for it pause, and what they may ask is bounded."""

import time

import pytest

from app.engine import EngineRejected, RequestStats
from app.settings import SettingsError, load_settings
from tests.helpers.servers import collect


def test_an_answer_that_asks_for_a_step_delay_pauses_after_every_step(engine, aio):
    started = time.monotonic()
    events = aio(collect(engine.stream(list(range(100, 140)), max_tokens=20, ignore_eos=True, step_delay_ms=50)))
    elapsed_s = time.monotonic() - started
    assert isinstance(events[-1], RequestStats)
    assert (events[-1].output_tokens, events[-1].finish_reason) == (20, "length")
    # One step per token, each followed by its 50 ms pause: a lower bound that no load can undercut.
    assert elapsed_s >= 20 * 0.050
    assert engine.in_flight == 0 and engine.num_unfinished_requests() == 0


def test_a_step_delay_outside_its_range_is_refused(engine, aio):
    with pytest.raises(EngineRejected) as exc:
        aio(collect(engine.stream([1, 2, 3], max_tokens=2, step_delay_ms=5000)))
    assert str(exc.value) == ("the model refused this request: prefixdesk_step_delay_ms must be a number of "
                              "milliseconds in (0, 1000], not 5000")
    assert aio(engine.health()).ok


def test_a_step_delay_without_an_engine_that_takes_it_names_the_setting():
    with pytest.raises(SettingsError) as exc:
        load_settings(environ={"PREFIXDESK_STEP_DELAY_MS": "20"})
    assert str(exc.value).startswith("PREFIXDESK_STEP_DELAY_MS needs PREFIXDESK_ENGINE_STEP_DELAYS=true: the engine "
                                     "ignores it otherwise. Tests only: ")
