"""What a Redis deployment looks like from tiermem's side: a standalone server or a
cluster, how many masters, and whether each group of keys a script declares together
(one session's, one user's) hashes to one slot, asked of the server with
``CLUSTER KEYSLOT``. ``tiermem doctor`` prints it (:func:`check_redis`), and with
``TIERMEM_REDIS_WAIT_REPLICAS`` flags a master with fewer replicas than the writes wait for.

A cluster refuses a script whose keys span slots (CROSSSLOT), so this is the property the
key layout in :mod:`tiermem.store.backends.redis` is built for; the check proves it on the
server the settings name, with ids that contain the characters escaping must neutralize.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from tiermem.settings import TierMemSettings
from tiermem.store.backends.redis_scripts import (
    CancelGuard,
    RedisClient,
    RedisIO,
    RedisKeys,
    client_from_url,
    map_redis_error,
)

__all__ = ["RedisTopology", "check_redis", "describe_redis", "probe_key_groups"]

PROBE_SESSION = "doctor:{probe}/s"
"""A session id with hash-tag braces and a ':' in it: escaping must keep its keys in one
slot all the same."""
PROBE_USER = "doctor:{probe}/u"


@dataclass(frozen=True)
class RedisTopology:
    """What :func:`describe_redis` found.

    ``slots`` maps each key group to the distinct slots its keys hash to (one, when the
    layout is right); ``problems`` says in words what is wrong and what to do.
    """

    mode: Literal["standalone", "cluster"]
    masters: int
    version: str
    slots: dict[str, list[int]]
    slots_from: Literal["server", "client"]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line for ``tiermem doctor``."""
        if self.mode == "cluster":
            head = f"Redis Cluster, {self.masters} master{'s' if self.masters != 1 else ''}"
        else:
            head = "standalone Redis server"
        groups = ", ".join(
            f"{name} keys -> slot {slots[0]}"
            if len(slots) == 1
            else f"{name} keys -> {len(slots)} slots {slots}"
            for name, slots in self.slots.items()
        )
        how = "CLUSTER KEYSLOT" if self.slots_from == "server" else "CRC16, as a cluster would"
        text = f"{head} (redis {self.version}); {groups} ({how})"
        return "; ".join([text, *self.problems])


def probe_key_groups(prefix: str) -> dict[str, list[str]]:
    """Every key a script declares for one session (hot and durable) and for one user,
    built by :class:`~tiermem.store.backends.redis_scripts.RedisKeys` for probe ids."""
    keys = RedisKeys(prefix)
    return {
        "session": [*keys.hot_session(PROBE_SESSION), *keys.durable_session(PROBE_SESSION)],
        "user": [
            *keys.user_sessions(PROBE_USER),
            keys.memories(PROBE_USER),
            keys.memories_by_time(PROBE_USER),
            keys.memory_types(PROBE_USER),
            keys.user_meta(PROBE_USER),
            keys.memories_of_type(PROBE_USER, "preference"),
        ],
    }


async def describe_redis(
    client: RedisClient, key_groups: Mapping[str, Sequence[str]]
) -> RedisTopology:
    """Whether ``client`` reaches a standalone server or a cluster, how many masters, and
    which slots each group of keys hashes to (``CLUSTER KEYSLOT`` on a cluster node; on a
    standalone server, which has no such command, redis-py's CRC16).

    A standalone client pointed at a cluster node is reported as a problem: it would
    follow no MOVED redirection.

    Raises:
        BackendError: Redis cannot be reached or refused a command (mapped as the stores
            map it).
    """
    try:
        with CancelGuard():  # a diagnostic a Ctrl-C must still stop
            return await _describe(client, key_groups)
    except (RedisError, RedisClusterException) as exc:
        raise map_redis_error(exc) from exc


async def _describe(client: RedisClient, key_groups: Mapping[str, Sequence[str]]) -> RedisTopology:
    problems: list[str] = []
    if isinstance(client, RedisCluster):
        await client.initialize()
        masters = len(client.get_primaries())
        info = await client.info("server", target_nodes=RedisCluster.RANDOM)
        version = str(info.get("redis_version", "?"))
        state = await client.execute_command("CLUSTER INFO", target_nodes=RedisCluster.RANDOM)
        if _field(state, "cluster_state") != "ok":
            problems.append(
                f"cluster_state is {_field(state, 'cluster_state')!r}: some slots are not "
                "served; check CLUSTER INFO on every node"
            )
        slots = {
            name: sorted({int(await client.execute_command("CLUSTER KEYSLOT", k)) for k in keys})
            for name, keys in key_groups.items()
        }
        return _checked(RedisTopology("cluster", masters, version, slots, "server", problems))
    info = await client.info("server")
    version = str(info.get("redis_version", "?"))
    if info.get("redis_mode") == "cluster":
        problems.append(
            "this server is a Redis Cluster node but the client is standalone: set "
            "TIERMEM_REDIS_CLUSTER=true so that it follows the cluster's redirections"
        )
        io = RedisIO(client)
        masters = int(_field(await io.execute("CLUSTER", "INFO"), "cluster_size") or 0)
        slots = {
            name: sorted({int(await io.execute("CLUSTER", "KEYSLOT", k)) for k in keys})
            for name, keys in key_groups.items()
        }
        return _checked(RedisTopology("cluster", masters, version, slots, "server", problems))
    return _checked(
        RedisTopology("standalone", 1, version, _local_slots(key_groups), "client", problems)
    )


async def _fewest_replicas(client: RedisClient) -> int:
    """The fewest replicas connected to any master (``INFO replication``), which is what
    a ``WAIT`` of the durable writes can count on."""
    if isinstance(client, RedisCluster):
        await client.initialize()
        counts = [
            int((await client.info("replication", target_nodes=node)).get("connected_slaves", 0))
            for node in client.get_primaries()
        ]
        return min(counts, default=0)
    return int((await client.info("replication")).get("connected_slaves", 0))


def _local_slots(key_groups: Mapping[str, Sequence[str]]) -> dict[str, list[int]]:
    return {name: sorted({key_slot(k.encode()) for k in keys}) for name, keys in key_groups.items()}


def _checked(topology: RedisTopology) -> RedisTopology:
    for name, slots in topology.slots.items():
        if len(slots) != 1:
            topology.problems.append(
                f"the {name} keys hash to {len(slots)} slots; a cluster would refuse their "
                "scripts (CROSSSLOT): this is a bug in the key layout, please report it"
            )
    return topology


def _field(info: object, name: str) -> str:
    """One field of a ``CLUSTER INFO`` answer (text, or a dict parsed by redis-py)."""
    if isinstance(info, dict):
        value = info.get(name, info.get(name.encode(), ""))
        return value.decode() if isinstance(value, bytes) else str(value)
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


async def check_redis(settings: TierMemSettings) -> RedisTopology:
    """:func:`describe_redis` on a client built from the settings (``redis_url``,
    ``redis_cluster``) for the keys of a probe session and user under ``redis_prefix``;
    nothing is written.

    Raises:
        TierMemError: the URL is invalid (ValidationError) or Redis failed (BackendError).
    """
    client = client_from_url(settings.redis_url, cluster=settings.redis_cluster)
    try:
        topology = await describe_redis(client, probe_key_groups(settings.redis_prefix))
        wanted = settings.redis_wait_replicas
        if wanted:
            try:
                with CancelGuard():
                    fewest = await _fewest_replicas(client)
            except (RedisError, RedisClusterException) as exc:
                raise map_redis_error(exc) from exc
            if fewest < wanted:
                topology.problems.append(
                    f"TIERMEM_REDIS_WAIT_REPLICAS={wanted} but a master has only {fewest} "
                    "connected replica(s): every turn on it would raise NotReplicatedError; "
                    "add replicas or lower the setting"
                )
        return topology
    finally:
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            await client.aclose()  # best effort: the answer is already in hand
