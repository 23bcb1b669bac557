"""Collective and point-to-point times with the alpha-beta model.

Thakur, Rabenseifner and Gropp 2005 ("Optimization of Collective Communication Operations in
MPICH"): a ring all-reduce over ``n`` ranks moves ``2(n−1)/n`` of the buffer through each rank's
link and pays ``2(n−1)`` start-ups; reduce-scatter and all-gather move half of that. A group is
as fast as the slowest link it crosses: ranks are numbered with tensor parallelism innermost, then
context parallelism, then data parallelism, then pipeline stages (Megatron's ``tp-cp-ep-dp-pp``;
torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]`` read from the right), so a group of
``n`` ranks ``stride`` apart spans ``n·stride`` consecutive ranks, and that span says whether it
stays inside a GPU package, inside a node, or crosses the network: a cp group is ``cp`` ranks
``tp`` apart, the dp x cp group (gradients, sharded state) ``dp·cp`` ranks ``tp`` apart, pipeline
neighbours ``tp·cp·dp`` apart. The system's ``collective`` efficiency is the
fraction of a link's datasheet bandwidth the collective library achieves.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.system import SystemSpec


def link_for_span(system: SystemSpec, span) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth bytes/s, latency s) of the slowest link a group spanning ``span`` ranks uses."""
    span = np.asarray(span)
    pkg, node, net = system.link("package"), system.link("node"), system.link("network")
    eff = system.eff("collective")
    in_pkg = span <= system.gpus_per_package
    in_node = span <= system.gpus_per_node
    bw = np.where(in_pkg, pkg.bandwidth, np.where(in_node, node.bandwidth, net.bandwidth)) * eff
    lat = np.where(in_pkg, pkg.latency, np.where(in_node, node.latency, net.latency))
    return bw, lat


def all_reduce(system: SystemSpec, n, stride, nbytes) -> np.ndarray:
    n = np.asarray(n)
    bw, lat = link_for_span(system, n * np.asarray(stride))
    t = 2 * (n - 1) / np.maximum(n, 1) * nbytes / bw + 2 * (n - 1) * lat
    return np.where(n > 1, t, 0.0)


def reduce_scatter(system: SystemSpec, n, stride, nbytes) -> np.ndarray:
    """Also the time of an all-gather producing ``nbytes``."""
    n = np.asarray(n)
    bw, lat = link_for_span(system, n * np.asarray(stride))
    t = (n - 1) / np.maximum(n, 1) * nbytes / bw + (n - 1) * lat
    return np.where(n > 1, t, 0.0)


all_gather = reduce_scatter


def send_recv(system: SystemSpec, distance, nbytes) -> np.ndarray:
    """One message between ranks ``distance`` apart."""
    bw, lat = link_for_span(system, np.asarray(distance) + 1)
    return nbytes / bw + lat
