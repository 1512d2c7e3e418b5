"""Every bound gpufleet puts on a list, a count or an amount, in one place.

Each bound is chosen so that what the API accepts, the rest of the system can carry: a gang of
`MAX_PODS_PER_GANG` pods can be dispatched, reported on by its cluster in one pod report under
the 1 MiB NATS message cap (`cluster_status.PodReport.encode` trims pod messages to fit), listed
and scheduled. docs/reference/rest.md ("Bounds") lists them.
"""

from __future__ import annotations

# Bytes: REST request bodies and NATS messages (the streams' max_msg_size).
MAX_MESSAGE_BYTES = 1 << 20

# A gang: pods in all its pod sets together, and pod sets.
MAX_PODS_PER_GANG = 5_000
MAX_POD_SETS = 16
# Labels, tolerations and the opaque container document of a workload.
MAX_LABELS = 64
MAX_TOLERATIONS = 32
MAX_CONTAINER_BYTES = 64 * 1024
MAX_ENV_VARS = 256

# Pages of lists: `limit` and `offset` (an offset beyond any real table still fits in 63 bits).
MAX_PAGE = 1_000
MAX_OFFSET = 10_000_000
# Bytes of one page of `GET /v1/workloads`: a page stops before it would pass this, and says where
# to go on. Its items are summaries (pod sets, counts) of at most ~30 KB each (64 labels at most).
MAX_PAGE_BYTES = 1 << 20
# One workload's view: its latest runs, and the first nodes (by name) of its current run. A run's
# placement is counted per pod set and pool, so the view of the largest gang stays a few KB.
MAX_RUNS_SHOWN = 20
MAX_NODES_SHOWN = 64

# Quota amounts (GPUs or gpu-eq per key) and prices (per GPU-hour): far above any real fleet,
# small enough that exact fraction arithmetic and float sums stay cheap and finite.
MAX_QUOTA_AMOUNT = 1_000_000.0
MAX_QUOTA_KEYS = 64
MAX_PRICE_PER_GPU_HOUR = 100_000.0
