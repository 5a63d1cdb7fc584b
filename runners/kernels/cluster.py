"""Sums split across a thread-block cluster (Hopper, sm_90, and later).

A kernel whose output needs more blocks than the output has tiles (a decode
gemm with few columns per SM, a row sum over few long rows) splits the
reduction across the ``ranks`` blocks of a cluster: each block leaves its
partial sums in its own shared memory, ``tm_cluster_sync`` makes them
visible to the whole cluster, and ``tm_cluster_sum`` adds one element over
every rank through distributed shared memory. A second ``tm_cluster_sync``
after the last read keeps each block alive until its peers are done with
its shared memory.

Clusters are launched with ``T.ClusterKernel``, which TileLang 0.1.13 and
0.1.15 both provide.
"""

from __future__ import annotations

import re

CLUSTER_MAX = 8  # the portable cluster size

CLUSTER_SUM_SOURCE = r"""
#include <cooperative_groups.h>
__device__ __forceinline__ void tm_cluster_sync() {
  cooperative_groups::this_cluster().sync();
}
__device__ __forceinline__ float tm_cluster_sum(float* part, int index, int ranks) {
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  float total = 0.0f;
  for (int r = 0; r < ranks; ++r) total += cluster.map_shared_rank(part, r)[index];
  return total;
}
"""


def clusters(target: dict) -> bool:
    """Thread-block clusters: CUDA from sm_90 (Hopper) on, sm_100 included."""
    arch = re.match(r"sm_(\d+)", target.get("arch", ""))
    return target["kind"] == "cuda" and arch is not None and int(arch[1]) >= 90


def ranks_for(blocks: int, wanted: int, steps: int, min_steps: int) -> int:
    """The fewest cluster ranks (a power of two up to ``CLUSTER_MAX``) that
    give ``blocks`` tiles at least ``wanted`` blocks in all, while each rank
    keeps ``min_steps`` of the ``steps`` it splits and takes an equal share."""
    ranks = 1
    while (
        blocks * ranks < wanted
        and ranks < CLUSTER_MAX
        and steps % (2 * ranks) == 0
        and steps // (2 * ranks) >= min_steps
    ):
        ranks *= 2
    return ranks
