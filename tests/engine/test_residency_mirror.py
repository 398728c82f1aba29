"""The residency mirror on synthetic KV events: what it holds after stores, evictions, salts and resets.

Events are the maps vLLM publishes (decoded msgpack); one test encodes a batch with vLLM's own
classes to check that the mirror reads the real wire format.
"""

import msgspec

from app.engine.residency import ResidencyMirror, decode_batch

BLOCK = 4


def stored(hashes, parent, tokens, extra_keys=None):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BLOCK, "extra_keys": extra_keys}


def removed(hashes):
    return {"type": "BlockRemoved", "block_hashes": hashes}


def mirror_with(*batches) -> ResidencyMirror:
    m = ResidencyMirror("ipc://unused", BLOCK)
    for i, events in enumerate(batches):
        m.apply(events, seq=i)
    return m


PROMPT = list(range(1, 13))  # three full blocks


def test_a_stored_chain_matches_by_tokens_and_stops_at_the_first_missing_block():
    m = mirror_with([stored([b"a", b"b"], None, PROMPT[:8])], [stored([b"c"], b"b", PROMPT[8:12])])
    assert m.match(PROMPT).resident_blocks == 3
    assert m.match(PROMPT + [99]).resident_blocks == 3 and m.match(PROMPT + [99]).num_blocks == 3
    assert m.match([1, 2, 3, 5] + PROMPT[4:]).resident_blocks == 0  # the first block differs
    m.apply([removed([b"b"])])
    match = m.match(PROMPT)
    assert (match.resident_blocks, match.resident_tokens, match.fully_resident) == (1, 4, False)
    assert m.num_cached_blocks() == 2  # "c" stays cached, though no lookup reaches it now


def test_salted_blocks_match_only_their_own_namespace():
    m = mirror_with([stored([b"s1"], None, PROMPT[:4], extra_keys=[("tenant-a",)])])
    assert m.match(PROMPT[:4]).resident_blocks == 0
    assert m.match(PROMPT[:4], cache_salt="tenant-b").resident_blocks == 0
    assert m.match(PROMPT[:4], cache_salt="tenant-a").resident_blocks == 1
    [root] = m.tree()
    assert root.cache_salt == "tenant-a"


def test_a_block_cached_twice_stays_until_both_copies_are_evicted():
    m = mirror_with([stored([b"a"], None, PROMPT[:4])], [stored([b"a"], None, PROMPT[:4])])
    assert m.num_cached_blocks() == 2
    m.apply([removed([b"a"])])
    assert m.match(PROMPT[:4]).resident_blocks == 1
    m.apply([removed([b"a"])])
    assert m.match(PROMPT[:4]).resident_blocks == 0


def test_the_tree_shares_a_parent_and_a_reset_clears_everything():
    m = mirror_with([stored([b"p"], None, PROMPT[:4]), stored([b"x"], b"p", [5, 6, 7, 8]),
                     stored([b"y"], b"p", [9, 9, 9, 9])])
    [root] = m.tree()
    assert (root.num_blocks, root.num_blocks_below, len(root.children)) == (1, 3, 2)
    m.apply([{"type": "AllBlocksCleared"}])
    assert (m.tree(), m.num_cached_blocks()) == ([], 0)
    assert m.stats().cleared == 1


def test_gaps_in_the_publishers_sequence_are_counted():
    m = ResidencyMirror("ipc://unused", BLOCK)
    m.apply([], seq=1)
    m.apply([], seq=4)
    assert (m.stats().batches, m.stats().missed_batches) == (2, 2)


def test_the_real_wire_format_of_vllm_decodes():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockStored, KVEventBatch

    batch = KVEventBatch(ts=1.0, events=[
        BlockStored(block_hashes=[b"h1"], parent_block_hash=None, token_ids=PROMPT[:4], block_size=BLOCK,
                    lora_id=None, medium="GPU", lora_name=None),
        AllBlocksCleared(),
    ])
    events = decode_batch(msgspec.msgpack.decode(msgspec.msgpack.encode(batch)))
    assert [e["type"] for e in events] == ["BlockStored", "AllBlocksCleared"]
    m = ResidencyMirror("ipc://unused", BLOCK)
    m.apply(events[:1])
    assert m.match(PROMPT[:4]).resident_blocks == 1
