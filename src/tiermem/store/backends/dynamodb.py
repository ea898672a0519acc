"""DynamoDB backend: both storage roles in one table (needs the ``dynamodb`` extra).

Create the table with :func:`create_table` (or the ``tiermem`` CLI, or the CloudFormation
template ``deploy/dynamodb.yaml``, which a test keeps equal to :func:`table_definition`).

Layout (one table; ``<…>`` segments are escaped with
:func:`tiermem.store.keys.escape_segment`, so no id can contain a ``#``)::

    table (pk, sk)                           PAY_PER_REQUEST, TTL attribute "ttl"
    ├── H#<session>                          hot session (DynamoDBHotStore)
    │   ├── META                             gen, version, next_index, lo (window start),
    │   │                                    gl/gh (gap after a restore), exp_us, ttl, cttl,
    │   │                                    md (metadata), tp (parts of split turns),
    │   │                                    ek (entity tags), st (state tags),
    │   │                                    act_pk/act_sk (activity index), lease_owner/_us
    │   ├── E#<kind>                         active entity                 tag, d
    │   ├── ST#<name>                        state blob                    tag, v, d, np
    │   │   └── ST#<name>#P0001…             its parts                     tag, d
    │   └── T#<index:012d>                   turn in the window            tag(=gen), d, np
    │       └── T#<index:012d>#P0001…        its parts                     tag, d
    ├── S#<session>                          durable session (DynamoDBDurableStore)
    │   ├── META                             session header (.dynamodb_header): mv, gen,
    │   │                                    born, next_index, exp_us (lifetime), ttl, hz
    │   │                                    (horizon), ref (owner), rk (record kinds), kc
    │   ├── KEY#<idempotency key>            an append's key               gen, first,
    │   │                                                                  count, ttl (=hz)
    │   ├── REC#<kind>                       session record                tag, version,
    │   │   └── REC#<kind>#P0001…            its parts                     gen, d, np,
    │   │                                                                  ttl (=hz)
    │   ├── TURN#<index:012d>                archived turn                 tag, bs, be, d,
    │   │   └── TURN#<index:012d>#P0001…     its parts                     np, exp_us, ttl
    │   └── USER#<user>                      "listed by <user>" (owner     upk, usk
    │                                        now or in a past life)
    ├── SHARED#<name> / SHARED               a blob shared by every worker (breakers): version,
    │                                        exp_us, upd_us, d, ttl (DynamoDBHotStore)
    └── U#<user>                             a user (DynamoDBDurableStore)
        ├── SESS#<created:18 digits>#<session>   session ref (newest first)   sid, d
        └── MEM#<memory_id>                  memory record                 d, version, lt,
                                                                           lc, exp_us, ttl
    LSI by_type     (pk, lt = <type>#<created>#<memory_id>)    memories by type, newest first
    LSI by_created  (pk, lc = <created>#<memory_id>)           memories, newest first
    GSI activity    (act_pk = ACT#<crc32(session) % shards>, act_sk = exp_us)
                    sharded expiry index of hot sessions, projects lease_us

``d`` holds the JSON of the model: a String up to 64 KB, else zlib-compressed Binary, split
into ``#P0001``… part items (written in the same transaction) when still over 350 KB; every
item stays well under DynamoDB's 400 KB. Timestamps in keys and numbers are microseconds.
The memory indexes are local so that queries are strongly consistent (a LSI limits each
partition key, e.g. one user, to 10 GB). No request path uses Scan.

See :mod:`.dynamodb_hot` and :mod:`.dynamodb_durable` for how writes stay atomic and how
many round trips each operation takes, :mod:`.dynamodb_header` for a durable session's
lifetime, lives and TTL horizon, and :mod:`.dynamodb_table` for error mapping.
"""

from tiermem.store.backends.dynamodb_durable import DynamoDBDurableStore
from tiermem.store.backends.dynamodb_hot import DynamoDBHotStore
from tiermem.store.backends.dynamodb_table import (
    TTL_ATTRIBUTE,
    create_table,
    table_definition,
)

__all__ = [
    "TTL_ATTRIBUTE",
    "DynamoDBDurableStore",
    "DynamoDBHotStore",
    "create_table",
    "table_definition",
]
