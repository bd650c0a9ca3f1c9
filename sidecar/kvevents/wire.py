"""vLLM's KV event messages, read and checked where they enter.

With `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'` vLLM
publishes every block it stores in and removes from the prefix cache on a ZMQ PUB socket
(vllm/distributed/kv_events.py, `ZmqEventPublisher`). A message is three frames: the topic,
an 8-byte big-endian sequence number, and a msgpack `KVEventBatch`: an array
`[ts, events, data_parallel_rank]` whose events are maps tagged by `type`:

- `BlockStored`: `block_hashes` (int or bytes each), `parent_block_hash` (or nil),
  `token_ids`, `block_size`, and since 0.11 or so `group_idx` (the KV cache group);
- `BlockRemoved`: `block_hashes`, `group_idx`;
- `AllBlocksCleared`: the cache was reset (a restart or `/reset_prefix_cache`).

Anything else in a message is another publisher's business or a broken one: an unknown event
type is counted and skipped, and so is an event of a KV offloading tier (`medium` other than
"GPU"); a batch that is not that shape is refused in one line. Pure: the
subscriber (`subscriber.py`) owns the socket.

Two readers agree on every message: msgspec checks a batch of the three known types against
typed structs in C (the cost the sidecar pays per block: issue #45's CPU target), and a batch
it does not take (an unknown event type, a wrong field) is read again field by field, which
counts unknown types and says what is wrong. (One leniency: the typed reader skips the fields
it does not read without checking their text, so a batch whose unread strings are not UTF-8 is
taken by it and would be refused field by field.)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

from kvwatch.sidecar.kvevents.bounds import MAX_EVENTS, MAX_HASH_BYTES, MAX_HASHES

__all__ = [
    "BlockKey",
    "block_key",
    "Stored",
    "Removed",
    "Cleared",
    "Event",
    "Batch",
    "WireError",
    "decode_batch",
    "decode_seq",
    "decode_fields",
]


class WireError(ValueError):
    """A message that is not a KV event batch; one line, safe to print."""


# A block: its KV cache group and hash as one 60-bit int (`block_key`)
BlockKey = int
# an int below 2^60 takes 32 bytes in CPython 3.11, one from 2^60 on 48 (its third 30-bit digit
# and the allocator's 16-byte classes: measured 32.1 and 48.2 bytes of RSS per int, 2026-12-06);
# a hash of 64 bits is past 2^60 seven times in eight, and the table holds two keys a block
_KEY_MASK = (1 << 60) - 1


def block_key(group: int, block_hash: int | bytes) -> BlockKey:
    """One block as the sidecar keeps it: the low 60 bits of Python's tuple hash of (group,
    hash), a bytes hash (vLLM's sha256 digests) by its first 8 bytes (a hash is only unique
    inside its group). The same in every process (an int hash is never salted, a bytes hash
    is), so replicas and recordings agree, and the curve's spatial sample is its low bits
    (reuse_curve.py). An int of 32 bytes where a (group, digest) tuple and its bytes took 121,
    and a tuple is hashed again at every dict lookup: the sidecar keeps up to 655,360 blocks
    (block_access.py). Two blocks collide with odds of 2^-60 a pair (4e-7 for a million
    blocks); a publisher that makes them collide on purpose spoils only its own curve."""
    if type(block_hash) is bytes:
        return hash((group, int.from_bytes(block_hash[:8], "big"))) & _KEY_MASK
    return hash((group, block_hash)) & _KEY_MASK


GPU = "GPU"  # the device pool's medium (vllm/distributed/kv_events.py, MEDIUM_GPU)


@dataclass(frozen=True, slots=True)
class Stored:
    keys: tuple[BlockKey, ...]  # in the order of the request's blocks
    parent: BlockKey | None  # the block before the first one, if any


@dataclass(frozen=True, slots=True)
class Removed:
    keys: tuple[BlockKey, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float  # the publisher's wall clock (time.time() on the server)
    events: tuple[Event, ...]
    unknown: int  # events of a type this reader does not know, skipped
    other_tier: int = 0  # events of a KV offloading tier (CPU, storage), skipped


def decode_seq(frame: bytes) -> int:
    """The publisher's sequence number: 8 bytes, big-endian, counting from 0."""
    if len(frame) != 8:
        raise WireError(f"a sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big")


def _hash(value: object) -> int | bytes:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise WireError(f"a block hash that is a {type(value).__name__}")
    if isinstance(value, bytes) and len(value) > MAX_HASH_BYTES:
        raise WireError(f"a block hash of {len(value)} bytes")
    return value


def _group(event: dict[object, object]) -> int:
    g = event.get("group_idx")
    if g is None:
        return 0
    if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 1024:
        raise WireError(f"group_idx {g!r} is not a KV cache group")
    return g


def _keys(event: dict[object, object], group: int) -> tuple[BlockKey, ...]:
    hashes = event.get("block_hashes")
    if not isinstance(hashes, list):
        raise WireError("an event without a list of block_hashes")
    if len(hashes) > MAX_HASHES:
        raise WireError(f"an event of {len(hashes)} blocks")
    return _keyed(group, [_hash(h) for h in hashes])


def _other_tier(raw: object) -> bool:
    """An event about a block in a KV offloading tier (`--kv-offloading-size`: vLLM publishes
    its CPU and storage tiers' stores and removals on the same stream, `medium` "CPU" or
    "STORAGE"), not in the GPU prefix cache the curve is about."""
    if not isinstance(raw, dict) or raw.get("type") not in ("BlockStored", "BlockRemoved"):
        return False
    medium = raw.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise WireError(f"a medium that is a {type(medium).__name__}, not a name")
    return _elsewhere(medium)


def _elsewhere(medium: str | None) -> bool:
    """A medium other than the GPU's (None: a vLLM from before media, all GPU)."""
    return medium is not None and medium.upper() != GPU


def _event(raw: object) -> Event | None:
    if not isinstance(raw, dict):
        raise WireError(f"an event that is a {type(raw).__name__}, not a map")
    kind = raw.get("type")
    if kind == "AllBlocksCleared":
        return Cleared()
    if kind == "BlockRemoved":
        return Removed(_keys(raw, _group(raw)))
    if kind != "BlockStored":
        return None
    group = _group(raw)
    parent = raw.get("parent_block_hash")
    if not isinstance(raw.get("token_ids"), list):
        raise WireError("a BlockStored without token_ids")
    return Stored(_keys(raw, group), None if parent is None else block_key(group, _hash(parent)))


_ARRAY_HEADS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}  # msgpack's array markers


def _keyed(group: int, hashes: list[int | bytes]) -> tuple[BlockKey, ...]:
    if len(hashes) == 1:  # most events: a decode block stored, a block evicted
        return (block_key(group, hashes[0]),)
    return tuple(map(block_key, repeat(group), hashes))


def _decode_typed(payload: bytes) -> Batch | None:
    """The batch if msgspec's typed structs take it; None: read it field by field."""
    from kvwatch.sidecar.kvevents.wire_structs import (
        BATCH,
        FCleared,
        FRemoved,
        FStored,
        ValidationError,
    )

    try:
        doc = BATCH.decode(payload)
    except ValidationError:
        return None
    events: list[Event] = []
    other = 0
    for e in doc.events:
        if not isinstance(e, FCleared) and _elsewhere(e.medium):
            other += 1
        elif isinstance(e, FStored):
            tokens = memoryview(e.token_ids)  # msgpack: its first byte says an array
            if not tokens or tokens[0] not in _ARRAY_HEADS:
                return None
            g, parent = e.group_idx or 0, e.parent_block_hash
            keys = _keyed(g, e.block_hashes)
            events.append(Stored(keys, None if parent is None else block_key(g, parent)))
        elif isinstance(e, FRemoved):
            events.append(Removed(_keyed(e.group_idx or 0, e.block_hashes)))
        else:
            events.append(Cleared())
    return Batch(float(doc.ts), tuple(events), 0, other)


def decode_batch(payload: bytes) -> Batch:
    """One message's payload as typed events; WireError if it is not a KV event batch."""
    import msgspec

    try:
        fast = _decode_typed(payload)
    except msgspec.DecodeError:
        fast = None  # not msgpack: the reader below says so
    return fast if fast is not None else decode_fields(payload)


def decode_fields(payload: bytes) -> Batch:
    """`decode_batch` field by field: the reader of last resort, and the fuzz target's
    reference for the typed one."""
    import msgspec

    try:
        doc = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError) as e:
        raise WireError(f"not msgpack: {str(e)[:80]}") from None
    if not isinstance(doc, list) or len(doc) < 2:
        raise WireError("a batch that is not [ts, events, ...]")
    ts, raw_events = doc[0], doc[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts < 1e11:
        raise WireError(f"a batch time of {str(ts)[:40]}")
    if not isinstance(raw_events, list) or len(raw_events) > MAX_EVENTS:
        raise WireError("a batch whose events are not a list of at most 100,000")
    events: list[Event] = []
    unknown = other = 0
    for raw in raw_events:
        if _other_tier(raw):
            other += 1
            continue
        event = _event(raw)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return Batch(float(ts), tuple(events), unknown, other)
