"""One run of the FGD placement experiment: pods arrive one at a time and are placed or dropped.

Protocol (FGD, ATC'23, as its simulator replays openb): the seed shuffles the pod list, clones
pods sampled with replacement until the GPU request reaches 1.3x the cluster, and ranks the nodes
(the random name prefix that breaks score ties). Each pod is placed on the feasible node with the
best score, or dropped for good; nothing departs, nothing is retried, moved or preempted. After
every pod the run records arrived and allocated GPU milli and the cluster's fragmentation
against the trace's typical pods.

Speed: a policy's score of a node depends only on the node's state and the pod's shape, and a
placement changes one node. So every pod shape keeps a heap of (score, rank) over the nodes it
fits, refreshed lazily: when a shape is asked for, only the nodes changed since it was last asked
are re-scored, and a stale heap top is dropped when it surfaces. Free capacity only shrinks, so a
node that cannot hold a shape now never will; it leaves that shape's heap for good. Scores are
also remembered per (node state, shape): many nodes share a state, and the same states recur
from seed to seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controlplane.core.fragmentation import MILLI, GpuFree, PodShape, WorkloadMix, node_fragmentation, take
from controlplane.tracesim.placement.policies import ScoreFn, affinity_class, best_fit_gpu
from controlplane.tracesim.placement.trace import TraceNode, TracePod

TUNE_RATIO = 1.3  # arrivals fill the cluster's GPU capacity this many times over


@dataclass(frozen=True)
class Arrivals:
    """The seeded arrival order: indexes into the pod list (clones repeat an index)."""

    order: tuple[int, ...]
    node_rank: tuple[int, ...]  # per node: lower wins a tie


def arrivals(pods: Sequence[TracePod], nodes: Sequence[TraceNode], seed: int, tune: float = TUNE_RATIO) -> Arrivals:
    """Shuffle the pods, then append clones drawn with replacement until the GPU request would pass
    `tune` x capacity, or drop random pods while it is above (FGD's TunePodsByNodeTotalResource)."""
    rng = random.Random(seed)
    by_name = sorted(range(len(pods)), key=lambda i: pods[i].name)
    rng.shuffle(by_name)
    order = by_name
    capacity = sum(node.gpus for node in nodes) * MILLI
    target = tune * capacity
    requested = sum(pods[i].shape.total_gpu_milli for i in order)
    if requested > target:
        while requested > target and order:
            removed = order.pop(rng.randrange(len(order)))
            requested -= pods[removed].shape.total_gpu_milli
    else:
        while True:
            index = rng.randrange(len(pods))
            # The simulator's stopping test adds the clone's per-GPU milli, not its total: kept.
            if requested + pods[index].shape.gpu_milli > target:
                break
            requested += pods[index].shape.total_gpu_milli
            order.append(index)
    ranks = list(range(len(nodes)))
    rng.shuffle(ranks)
    return Arrivals(tuple(order), tuple(ranks))


@dataclass
class RunCurves:
    """Per-pod samples of one run, already bucketed by arrived demand (integer percent)."""

    capacity_milli: int
    pods: int = 0
    placed: int = 0
    # bucket -> [samples, sum unallocated %, sum frag amount %, sum frag rate %]
    buckets: dict[int, list[float]] = field(default_factory=dict)
    # GPU milli of the pods dropped before demand reached capacity, by pod class (share, 1-gpu, ...)
    dropped_by_class: dict[str, int] = field(default_factory=dict)

    def add(self, arrived: int, used: int, frag: float, idle: int) -> None:
        arrive_pct = 100.0 * arrived / self.capacity_milli
        bucket = self.buckets.get(round(arrive_pct))
        if bucket is None:
            bucket = self.buckets[round(arrive_pct)] = [0.0, 0.0, 0.0, 0.0]
        bucket[0] += 1
        bucket[1] += 100.0 - 100.0 * used / self.capacity_milli
        bucket[2] += 100.0 * frag / self.capacity_milli
        bucket[3] += 100.0 * frag / idle if idle else 100.0

    def curve(self) -> dict[int, tuple[float, float, float]]:
        """(unallocated %, fragmentation amount %, fragmentation rate %) per arrived percent; a
        percent without samples takes those within one point of it (FGD's merge scripts)."""
        top = max(self.buckets, default=0)
        out: dict[int, tuple[float, float, float]] = {}
        for k in range(top + 2):
            rows = (
                [self.buckets[k]]
                if k in self.buckets
                else [self.buckets[j] for j in (k - 1, k + 1) if j in self.buckets]
            )
            count = sum(r[0] for r in rows)
            if count:
                out[k] = (
                    sum(r[1] for r in rows) / count,
                    sum(r[2] for r in rows) / count,
                    sum(r[3] for r in rows) / count,
                )
        return out


ProgressFn = Callable[[int], None]


class Simulation:
    """The cluster of one run and the policy placing onto it."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        pods: Sequence[TracePod],
        metric_mix: WorkloadMix,
        score: ScoreFn | None,
        uses_tags: bool = False,
        cache: dict[tuple[object, ...], tuple[float, int]] | None = None,
        frag_cache: dict[tuple[str, int, GpuFree], float] | None = None,
    ) -> None:
        self.nodes = nodes
        self.pods = pods
        self.metric_mix = metric_mix
        self.score = score  # None: the Random policy
        self.uses_tags = uses_tags
        self.cache = {} if cache is None else cache
        self.frag_cache = {} if frag_cache is None else frag_cache
        # Full shapes (what feasibility depends on) and score shapes (what the score depends on).
        self.shape_ids: dict[tuple[int, PodShape], int] = {}
        self.shape_of_pod = [self._shape_id(pod) for pod in pods]
        self.shapes = list(self.shape_ids)

    def _shape_id(self, pod: TracePod) -> int:
        key = (pod.memory_mib, pod.shape)
        return self.shape_ids.setdefault(key, len(self.shape_ids))

    def _frag(self, model: str, cpu: int, gpus: GpuFree) -> float:
        key = (model, cpu, gpus)
        found = self.frag_cache.get(key)
        if found is None:
            found = self.frag_cache[key] = node_fragmentation(self.metric_mix, model, cpu, gpus)
        return found

    def run(self, seed: int, progress: ProgressFn | None = None, tune: float = TUNE_RATIO) -> RunCurves:
        """One seeded run of the experiment."""
        plan = arrivals(self.pods, self.nodes, seed, tune)
        return self.replay(plan, random.Random(seed * 7919 + 1), progress)

    def replay(self, plan: Arrivals, rng: random.Random, progress: ProgressFn | None = None) -> RunCurves:
        """Place the pods of `plan` in its order; `rng` is the Random policy's own stream."""
        nodes, pods = self.nodes, self.pods
        n = len(nodes)
        model = [node.model for node in nodes]
        cpu = [node.cpu_milli for node in nodes]
        mem = [node.memory_mib for node in nodes]
        gpus: list[GpuFree] = [(MILLI,) * node.gpus for node in nodes]
        tags: list[frozenset[str]] = [frozenset()] * n
        version = [0] * n
        rank = plan.node_rank
        frag = [self._frag(model[i], cpu[i], gpus[i]) for i in range(n)]
        total_frag = sum(frag)
        idle = sum(sum(g) for g in gpus)
        capacity = idle
        curves = RunCurves(capacity)
        log: list[int] = []  # nodes in the order they changed
        heaps: dict[int, list[tuple[float, int, int, int]]] = {}
        seen_at: dict[int, int] = {}  # shape -> length of `log` when its heap was last refreshed
        pushed: dict[int, list[int]] = {}  # shape -> per node, the version last scored (-1: never)
        arrived = 0
        used = 0
        cache = self.cache
        score_fn = self.score
        uses_tags = self.uses_tags

        def feasible(i: int, memory: int, shape: PodShape) -> bool:
            if cpu[i] < shape.cpu_milli or mem[i] < memory:
                return False
            if shape.gpu_count == 0:
                return True
            if shape.gpu_models and model[i] not in shape.gpu_models:
                return False
            g = gpus[i]
            if shape.shares_gpu:
                return bool(g) and g[0] >= shape.gpu_milli
            return len(g) >= shape.gpu_count and g[shape.gpu_count - 1] == MILLI

        def scored(i: int, shape: PodShape) -> tuple[float, int]:
            assert score_fn is not None
            key: tuple[object, ...] = (
                (shape, model[i], cpu[i], gpus[i], tags[i]) if uses_tags else (shape, model[i], cpu[i], gpus[i])
            )
            found = cache.get(key)
            if found is None:
                found = cache[key] = score_fn(model[i], cpu[i], gpus[i], tags[i], shape)
            return found

        def choose(shape_id: int) -> tuple[int, int] | None:
            memory, shape = self.shapes[shape_id]
            heap = heaps.get(shape_id)
            marks = pushed.get(shape_id)
            if heap is None or marks is None:
                heap = heaps[shape_id] = []
                marks = pushed[shape_id] = [-1] * n
                candidates: Sequence[int] = range(n)
            else:
                candidates = log[seen_at[shape_id] :]
            seen_at[shape_id] = len(log)
            for i in candidates:
                if marks[i] == version[i]:
                    continue
                marks[i] = version[i]
                if feasible(i, memory, shape):
                    value = scored(i, shape)[0]
                    heapq.heappush(heap, (-value, rank[i], i, version[i]))
            while heap:
                _, _, i, v = heap[0]
                if v != version[i]:
                    heapq.heappop(heap)
                    continue
                return i, scored(i, shape)[1]
            return None

        def choose_random(shape_id: int) -> tuple[int, int] | None:
            memory, shape = self.shapes[shape_id]
            # Uniform over feasible nodes: rejection sampling, then a full scan when most nodes
            # are full (the scan draws from the same uniform distribution).
            for _ in range(64):
                i = rng.randrange(n)
                if feasible(i, memory, shape):
                    break
            else:
                fitting = [i for i in range(n) if feasible(i, memory, shape)]
                if not fitting:
                    return None
                i = fitting[rng.randrange(len(fitting))]
            if not shape.shares_gpu:
                return i, MILLI
            options = [free for free in gpus[i] if free >= shape.gpu_milli]
            return i, options[rng.randrange(len(options))]

        for step, pod_index in enumerate(plan.order):
            pod = pods[pod_index]
            shape = pod.shape
            arrived += shape.total_gpu_milli
            picked = (
                choose_random(self.shape_of_pod[pod_index])
                if score_fn is None
                else choose(self.shape_of_pod[pod_index])
            )
            if picked is not None:
                i, share_from = picked
                cpu[i] -= shape.cpu_milli
                mem[i] -= pod.memory_mib
                if shape.gpu_count:
                    gpus[i] = take(gpus[i], shape, share_from if shape.shares_gpu else MILLI)
                    tag = affinity_class(shape)
                    if tag not in tags[i]:
                        tags[i] = tags[i] | {tag}
                used += shape.total_gpu_milli
                idle -= shape.total_gpu_milli
                version[i] += 1
                log.append(i)
                new_frag = self._frag(model[i], cpu[i], gpus[i])
                total_frag += new_frag - frag[i]
                frag[i] = new_frag
                curves.placed += 1
            elif arrived <= capacity:
                tag = affinity_class(shape) or "cpu"
                curves.dropped_by_class[tag] = curves.dropped_by_class.get(tag, 0) + shape.total_gpu_milli
            curves.pods += 1
            curves.add(arrived, used, total_frag, idle)
            if progress is not None and step % 500 == 499:
                progress(500)
        if progress is not None:
            progress(len(plan.order) % 500)
        return curves


__all__ = ["Arrivals", "RunCurves", "Simulation", "arrivals", "best_fit_gpu"]
