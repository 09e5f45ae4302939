"""Compatibility path: the code lives in delayjobs.index (keys, client, store)."""

from delayjobs.index.client import (
    Client,
    ClusterUnreachable,
    describe_target,
    get_client,
    mask_url,
    reset_client,
)
from delayjobs.index.keys import (
    LANE_SEPARATOR,
    IndexEntry,
    control_channel,
    due_key,
    index_entry,
    lane,
    lanes,
    preload_lock_key,
    split_lane,
    wake_channel,
)
from delayjobs.index.store import (
    ADD_LUA,
    POP_DUE_LUA,
    RELEASE_LOCK_LUA,
    SCRIPT_CHUNK,
    RedisStore,
    get_store,
)

__all__ = [
    "ADD_LUA",
    "LANE_SEPARATOR",
    "POP_DUE_LUA",
    "RELEASE_LOCK_LUA",
    "SCRIPT_CHUNK",
    "Client",
    "ClusterUnreachable",
    "IndexEntry",
    "RedisStore",
    "control_channel",
    "describe_target",
    "due_key",
    "get_client",
    "get_store",
    "index_entry",
    "lane",
    "lanes",
    "mask_url",
    "preload_lock_key",
    "reset_client",
    "split_lane",
    "wake_channel",
]
