"""msgspec's typed structs for vLLM's three KV events and a batch of them: wire.py's fast
reader, which checks in C what its field reader checks in Python (the same bounds). Imported
on first use: msgspec comes with the `kvevents` extra. (No `from __future__ import
annotations`: msgspec reads these annotations as types.)"""

from typing import Annotated

import msgspec
from msgspec import ValidationError

from kvwatch.sidecar.kvevents.bounds import MAX_EVENTS, MAX_HASH_BYTES, MAX_HASHES

__all__ = ["BATCH", "FBatch", "FStored", "FRemoved", "FCleared", "ValidationError"]

Hash = int | Annotated[bytes, msgspec.Meta(max_length=MAX_HASH_BYTES)]
Hashes = Annotated[list[Hash], msgspec.Meta(max_length=MAX_HASHES)]
Group = Annotated[int, msgspec.Meta(ge=0, lt=1024)] | None


class FStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: Hashes
    token_ids: msgspec.Raw  # required and a list (wire.py checks its first byte), not decoded
    parent_block_hash: Hash | None = None
    group_idx: Group = None
    medium: str | None = None  # "GPU", or a KV offloading tier's ("CPU", "STORAGE")


class FRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: Hashes
    group_idx: Group = None
    medium: str | None = None


class FCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


class FBatch(msgspec.Struct, array_like=True):
    ts: Annotated[float, msgspec.Meta(ge=0, lt=1e11)]
    events: Annotated[list[FStored | FRemoved | FCleared], msgspec.Meta(max_length=MAX_EVENTS)]


BATCH = msgspec.msgpack.Decoder(FBatch)
