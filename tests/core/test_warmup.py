"""The start-up's sampler warm-up: one batch of requests at once with the customers' sampling, before ready,
counted nowhere in the hit rate the console shows."""

from app.core.warmup import SAMPLER_BATCH, SAMPLER_LONG, SAMPLER_LONG_TOKENS, SAMPLER_TOKENS, probe_token, warm_sampling
from tests.helpers.servers import SecondServer

# One prompt token each (the probe) and every answer to its budget.
BATCH_TOKENS = SAMPLER_BATCH + SAMPLER_LONG * SAMPLER_LONG_TOKENS + (SAMPLER_BATCH - SAMPLER_LONG) * SAMPLER_TOKENS


def test_the_sampler_batch_runs_all_at_once_and_moves_no_hit_rate(engine, services, aio):
    engine.reset_max_running_seen()
    before = engine.snapshot()
    ran = aio(warm_sampling(engine, probe_id=probe_token(services.prompts.tokenizer)))
    after = engine.snapshot()
    assert ran == SAMPLER_BATCH
    assert after.max_running_seen == SAMPLER_BATCH  # all of them in one engine step: the batched sampler ran
    assert after.num_engine_tokens - before.num_engine_tokens == BATCH_TOKENS
    # No prefix-cache lookup, so vLLM's queries and hits, the console's hit rate, did not move.
    assert (after.queries, after.hits) == (before.queries, before.hits)
    # The recent window only ages meanwhile (on a slow machine it drops the oldest steps): it gained nothing.
    assert after.recent_queries <= before.recent_queries and after.recent_hits <= before.recent_hits


def test_a_server_reports_ready_only_after_the_sampler_batch(services, engine, engine_loop, tmp_path):
    engine.reset_max_running_seen()
    before = engine.snapshot().num_engine_tokens
    server = SecondServer(services, engine_loop, tmp_path)
    with server:  # returns once the server's start-up says ready
        assert engine.snapshot().max_running_seen == SAMPLER_BATCH  # the templates' touches ran one at a time
        assert engine.num_unfinished_requests() == 0
        # Each template touched twice (its prefix and the probe token, one token out), then the whole batch.
        catalog = server.services.catalog
        touches = sum(2 * (len(catalog.prefix_ids(t.name)) + 2) for t in catalog.all())
        assert engine.snapshot().num_engine_tokens - before == touches + BATCH_TOKENS
