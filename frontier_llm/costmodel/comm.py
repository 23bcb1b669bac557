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


def link_for_span(system: SystemSpec, span, stride=None) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth bytes/s, latency s) of the slowest link a group spanning ``span`` ranks uses,
    its members ``stride`` apart (None: one member per node's link, the conservative case).

    Rails: a group that crosses the network with ``k`` members in each node runs ``k`` rings
    at once, each leaving the node through its own GPU's NIC (NCCL's rail-aligned channels; its
    bus bandwidth across nodes is the node's NICs together: NVIDIA nccl-tests,
    doc/PERFORMANCE.md, "bus bandwidth"), so a member sees ``k`` times the per-GPU network
    link, never more than its node link. A TP-strided data-parallel group has one member per
    node (``k = 1``): the neighbouring groups use the other NICs. A network tier with
    ``rails`` False (specs/system.py LinkTier) gives every group one NIC's rate (``k = 1``)."""
    span = np.asarray(span)
    pkg, node, net = system.link("package"), system.link("node"), system.link("network")
    eff = system.eff("collective")
    in_pkg = span <= system.gpus_per_package
    # A rack-scale NVLink domain (GB200 NVL72) is one node for the link a group uses.
    in_node = span <= system.scale_up_domain
    rails = 1
    # A network whose communicators leave the node through one NIC (LinkTier.rails) has no
    # rails to spread over.
    if stride is not None and net.rails:
        stride = np.maximum(np.asarray(stride), 1)
        rails = np.clip(system.gpus_per_node // stride, 1, np.maximum(span // stride, 1))
    net_bw = np.minimum(net.bandwidth * rails, node.bandwidth)
    bw = np.where(in_pkg, pkg.bandwidth, np.where(in_node, node.bandwidth, net_bw)) * eff
    lat = np.where(in_pkg, pkg.latency, np.where(in_node, node.latency, net.latency))
    return bw, lat


def all_reduce(system: SystemSpec, n, stride, nbytes, rails=False) -> np.ndarray:
    """A ring all-reduce of ``nbytes`` over ``n`` ranks ``stride`` apart. ``rails`` (a bool or
    one per row): spread over the node's NICs (:func:`link_for_span`), which the model applies
    to the data-parallel buckets of gradients and parameters, the large messages nccl-tests'
    bus bandwidth is measured with; else through one NIC's rate per member."""
    n = np.asarray(n)
    bw, lat = _link(system, n, stride, rails)
    t = 2 * (n - 1) / np.maximum(n, 1) * nbytes / bw + 2 * (n - 1) * lat
    return np.where(n > 1, t, 0.0)


def reduce_scatter(system: SystemSpec, n, stride, nbytes, rails=False) -> np.ndarray:
    """Also the time of an all-gather producing ``nbytes``."""
    n = np.asarray(n)
    bw, lat = _link(system, n, stride, rails)
    t = (n - 1) / np.maximum(n, 1) * nbytes / bw + (n - 1) * lat
    return np.where(n > 1, t, 0.0)


all_gather = reduce_scatter


def _link(system: SystemSpec, n, stride, rails) -> tuple[np.ndarray, np.ndarray]:
    span = n * np.asarray(stride)
    railed = link_for_span(system, span, stride)
    if rails is True:
        return railed
    single = link_for_span(system, span)
    if rails is False:
        return single
    rails = np.asarray(rails, dtype=bool)
    return np.where(rails, railed[0], single[0]), np.where(rails, railed[1], single[1])


def all_to_all(system: SystemSpec, n, stride, nbytes, remote_factor=1.0) -> np.ndarray:
    """An all-to-all in which each of ``n`` ranks ``stride`` apart sends ``nbytes`` (already
    the part leaving it, spread evenly over the ``n−1`` others) as ``n−1`` pairwise messages,
    each on the link tier it crosses. A group inside one scale-up domain (a node's NVLink, a
    GB200 NVL72 rack) sends everything at that speed (:func:`link_for_span`). A group spanning
    domains has ``k`` members in each: ``(k−1)/(n−1)`` of the bytes stay in the domain at the
    node link's rate, ``(n−k)/(n−1)`` leave it through the member's own NIC (no rails: the
    traffic is not a ring NCCL can spread over the node's NICs). Both transports run at once
    (NCCL's grouped send/recv drives the peers of every tier together), so the slower sets the
    time: ``max(intra/bw_node, remote/bw_net) + Σ α``. ``remote_factor`` scales the bytes that
    leave the domain (a dispatcher that sends one copy per node, not per expert:
    costmodel/moe.py ``remote_copy_factor``)."""
    n = np.asarray(n)
    stride = np.maximum(np.asarray(stride), 1)
    span = n * stride
    bw, lat = link_for_span(system, span)
    inside = nbytes / bw + (n - 1) * lat
    eff = system.eff("collective")
    node, net = system.link("node"), system.link("network")
    k = np.clip(system.scale_up_domain // stride, 1, np.maximum(n, 1))
    others = np.maximum(n - 1, 1)
    intra = nbytes * (k - 1) / others / (node.bandwidth * eff)
    remote = nbytes * np.asarray(remote_factor) * (n - k) / others / (net.bandwidth * eff)
    mixed = np.maximum(intra, remote) + (k - 1) * node.latency + (n - k) * net.latency
    crosses = span > system.scale_up_domain
    return np.where(n > 1, np.where(crosses, mixed, inside), 0.0)


def send_recv(system: SystemSpec, distance, nbytes) -> np.ndarray:
    """One message between ranks ``distance`` apart."""
    bw, lat = link_for_span(system, np.asarray(distance) + 1)
    return nbytes / bw + lat
