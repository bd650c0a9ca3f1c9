"""The most a KV event batch may hold, shared by wire.py's two readers (its field reader and
msgspec's typed structs in wire_structs.py): past these a batch is no vLLM's."""

from __future__ import annotations

__all__ = ["MAX_EVENTS", "MAX_HASHES", "MAX_HASH_BYTES"]

MAX_EVENTS = 100_000  # vLLM's own queue bound (KVEventsConfig.max_queue_size)
MAX_HASHES = 65_536  # blocks in one event: a 1M-token prompt at block size 16
MAX_HASH_BYTES = 64  # vLLM's hashes are 8-byte ints or 32-byte sha256 digests
