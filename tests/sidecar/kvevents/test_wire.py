"""vLLM's KV event messages read where they enter: the shapes vLLM sends, and what it never does."""

from __future__ import annotations

import msgspec
import pytest

from kvwatch.sidecar.kvevents.subscriber import check_endpoint
from kvwatch.sidecar.kvevents.wire import (
    Cleared,
    Removed,
    Stored,
    WireError,
    block_key,
    decode_batch,
    decode_fields,
    decode_seq,
)


def _pack(doc: object) -> bytes:
    return msgspec.msgpack.encode(doc)


def test_the_shapes_vllm_sends() -> None:
    # as vLLM 0.32 encodes a KVEventBatch (array_like, events tagged by type)
    b = decode_batch(_pack([1.7e9, [
        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
         "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 1},
        {"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None,
         "token_ids": [], "block_size": 16},
        {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
        {"type": "SomethingNewer", "x": 1},
    ], None]))  # fmt: skip
    assert b.ts == 1.7e9 and b.unknown == 1
    assert b.events == (
        Stored((block_key(1, 11), block_key(1, 12)), block_key(1, 10)),
        Stored((block_key(0, b"\x01" * 32),), None),
        Removed((block_key(0, 11),)),
        Cleared(),
    )
    assert decode_seq((7).to_bytes(8, "big")) == 7


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        _pack({"ts": 1}),
        _pack([1.0]),
        _pack(["x", []]),
        _pack([float("nan"), []]),
        _pack([1.0, {}]),
        _pack([1.0, [3]]),
        _pack([1.0, [{"type": "BlockStored", "block_hashes": 5, "token_ids": []}]]),
        _pack([1.0, [{"type": "BlockStored", "block_hashes": [1.5], "token_ids": []}]]),
        _pack([1.0, [{"type": "BlockStored", "block_hashes": [True], "token_ids": []}]]),
        _pack([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]),
        _pack([1.0, [{"type": "BlockRemoved", "block_hashes": [b"x" * 65]}]]),
        _pack([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "group_idx": -1}]]),
        _pack([1.0, [{"type": "BlockRemoved", "block_hashes": list(range(70_000))}]]),
    ],
)
def test_what_vllm_never_sends_is_refused_in_one_line(payload: bytes) -> None:
    with pytest.raises(WireError) as e:
        decode_batch(payload)
    assert "\n" not in str(e.value)


def test_a_kv_offloading_tiers_events_are_counted_and_left_out() -> None:
    """With --kv-offloading-size vLLM publishes its CPU (and storage) tier's stores and
    removals on the same stream: they are not the GPU prefix cache the curve draws."""
    payload = _pack([1.7e9, [
        {"type": "BlockStored", "block_hashes": [11], "parent_block_hash": None,
         "token_ids": [1] * 16, "block_size": 16, "lora_id": None, "medium": "CPU"},
        {"type": "BlockRemoved", "block_hashes": [11], "medium": "STORAGE"},
        {"type": "BlockStored", "block_hashes": [12], "parent_block_hash": None,
         "token_ids": [1] * 16, "block_size": 16, "lora_id": None, "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [12], "medium": None},
    ], None])  # fmt: skip
    b = decode_batch(payload)
    key = block_key(0, 12)
    assert b.events == (Stored((key,), None), Removed((key,))) and b.other_tier == 2
    assert decode_fields(payload) == b  # the typed reader and the field reader agree
    with pytest.raises(WireError, match="medium"):
        decode_batch(_pack([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 5}]]))


def test_a_sequence_frame_is_eight_bytes() -> None:
    with pytest.raises(WireError):
        decode_seq(b"\x00" * 7)


@pytest.mark.parametrize(
    "endpoint", ["tcp://*:5557", "tcp://host", "tcp://h:0", "udp://x:1", "ipc://", ""]
)
def test_an_endpoint_it_cannot_follow_is_refused(endpoint: str) -> None:
    with pytest.raises(ValueError):
        check_endpoint(endpoint)
    assert check_endpoint("tcp://10.0.0.5:5557") and check_endpoint("ipc:///run/kv.sock")


def test_a_block_key_is_its_group_and_hash_as_one_int() -> None:
    digest = bytes(range(32))
    # the low 60 bits of the value the curve's spatial sample took from (group, digest) before
    # keys were ints: the same sample (its low 24 bits), an int of 32 bytes, not 48
    mask = (1 << 60) - 1
    assert block_key(0, digest) == hash((0, int.from_bytes(digest[:8], "big"))) & mask
    assert block_key(3, 12345) == hash((3, 12345)) & mask
    assert 0 <= block_key(0, digest) < 1 << 60 and 0 <= block_key(5, -1) < 1 << 60
    # a hash is only unique inside its group; a digest by its first 8 bytes
    assert block_key(0, 7) != block_key(1, 7)
    assert block_key(0, digest) != block_key(0, bytes(reversed(digest)))
    assert isinstance(block_key(0, digest), int)
