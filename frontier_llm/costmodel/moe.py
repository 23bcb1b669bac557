"""Mixture-of-Experts physics of the cost model: what an MoE block adds to a dense one.

A dense model never reaches this module (every hook in flops/params/memory/steptime is guarded by
``model.is_moe``), so dense predictions are unchanged. The cost model prices the *mean* block:
``moe_blocks / layers`` of every MoE term below is spread over every block, as the dense model
prices ``l/p`` identical blocks per stage (docs/costmodel.md, "Mixture-of-Experts").

- FLOPs: an MoE block's MLP is the router GEMM (``h x E``) and ``top_k + shared`` expert MLPs of
  width ``f_e`` per token: the ACTIVE parameters, as Megatron-LM counts model FLOPs for MoE
  (megatron/training/training.py, ``num_floating_point_operations``: the MLP term scaled by
  ``num_experts_routed_to = moe_router_topk``, plus ``moe_shared_expert_intermediate_size``;
  Megatron-LM core_r0.9.0 onward). We also count the router GEMM (``2·h·E``), which that
  function leaves out: under 0.1 % of a block for Mixtral.
- Parameters: routed experts split over ``ep`` and expert-tp (the layout's etp, tp by default:
  Megatron-Core's ``expert_tensor_parallel_size`` = tp unless given; specs/axes.py), the router
  replicated, shared experts over tp (Megatron-Core's SharedExpertMLP is not an expert layer).
- Sharded model states: the routed experts' share is sharded over expert-dp =
  tp·cp·dp/(etp·ep) (the ranks holding the same experts), never over more
  (:func:`expert_degree`).
- Expert tensor parallelism below tp (etp 1 under tp 4, Megatron-Core's MoE parallel folding):
  each rank dispatches its sequence-parallel share of the tokens (Megatron-Core asks sequence
  parallelism for MoE with tp > 1), gathered over etp ranks only, so a local expert's GEMM has
  ``etp/tp`` of the rows on ``tp/etp`` times the weight width (:func:`expert_rows`,
  :func:`expert_gemm_slowdown`); the MLP's tp collective runs over etp ranks
  (:func:`mlp_tp_comm`) and the ep group is ep ranks etp apart (:func:`all_to_all_times`).
- Step time: the slowest EP rank sets the pace (dropless routing computes every routed token):
  its expert GEMMs run :data:`LOAD_IMBALANCE` times the mean rows, on smaller GEMMs
  (:func:`expert_gemm_slowdown`); four all-to-alls per MoE block and micro-batch (dispatch and
  combine, forward and backward; :func:`all_to_all_times`).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel import comm, gemm
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Recompute
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Load imbalance: the most loaded expert's tokens over the mean, max/mean = 1 + MaxVio.
# Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"
# (arXiv 2408.15664), Table 1: the aux-loss-balanced ("loss-controlled") 1B MoE trains at
# MaxVio_global = 0.72 (their loss-free method: 0.04). We take the aux-loss figure, the router
# Megatron-Core and torchtitan train with by default, for every MoE model: a stated physical
# ratio, never fitted. Applied per EP rank it is an upper bound (a rank holding E/ep experts
# averages their loads), which keeps the prediction on the slow side.
LOAD_IMBALANCE = 1.72


def _fraction(model: ModelSpec) -> float:
    """Share of the blocks that are MoE blocks (what the mean block carries of each MoE term)."""
    return model.moe_blocks / model.layers


def expert_mlp_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of one expert MLP of width ``expert_ffn_hidden``."""
    return 2.0 * model.mlp_matrices * model.hidden * model.expert_ffn_hidden


def routed_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the routed experts, on the mean block (top_k experts of the
    MoE blocks' share): the work the load imbalance and the small expert GEMMs slow down."""
    return _fraction(model) * model.top_k * expert_mlp_flops(model)


def mlp_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the mean block's MLP: dense blocks' ``2·m·h·f``, MoE blocks'
    router ``2·h·E`` plus ``(top_k + shared)`` expert MLPs (the active parameters)."""
    dense = 2.0 * model.mlp_matrices * model.hidden * model.ffn_hidden
    moe = (2.0 * model.hidden * model.num_experts
           + (model.top_k + model.shared_experts) * expert_mlp_flops(model))
    frac = _fraction(model)
    return (1 - frac) * dense + frac * moe


def mlp_params_per_rank(model: ModelSpec, width: int, tp):
    """One MLP of width ``width`` on one (expert-)TP rank: column-parallel input matrices and
    biases, the row-parallel output matrix, its bias whole (params.layer_params_per_rank's
    split)."""
    tp = np.asarray(tp)
    f = width // tp
    bias = ((model.mlp_matrices - 1) * f + model.hidden) if model.bias else 0
    return model.mlp_matrices * model.hidden * f + bias


def layer_params_per_rank(model: ModelSpec, tp, ep, dense_per_rank, frac=None, etp=None):
    """(all, routed experts) parameters of the mean block on one rank; ``dense_per_rank`` is
    params.layer_params_per_rank of the same model (attention + a dense MLP of ffn_hidden).
    ``frac``: the share of MoE blocks (default the model's; 1 an MoE block, 0 a dense one).
    ``etp``: the routed experts' tensor-parallel degree (None: tp)."""
    dense_mlp = mlp_params_per_rank(model, model.ffn_hidden, tp)
    attention = dense_per_rank - dense_mlp
    frac = _fraction(model) if frac is None else frac
    expert = mlp_params_per_rank(model, model.expert_ffn_hidden, tp)
    routed_expert = expert if etp is None else mlp_params_per_rank(
        model, model.expert_ffn_hidden, etp)
    # The router is replicated on every rank (Megatron-Core's TopKRouter weight is not split).
    shared = model.router_params() + model.shared_experts * expert
    routed = frac * (model.num_experts // np.asarray(ep)) * routed_expert
    return attention + (1 - frac) * dense_mlp + frac * shared + routed, routed


def routed_params_per_rank(model: ModelSpec, t):
    """Routed-expert parameters of the mean block on one rank of table ``t``."""
    return layer_params_per_rank(model, t.tp, axes.degree(t, "ep"), 0,
                                 etp=axes.expert_tensor_parallel(t))[1]


def stage_moe_share(model: ModelSpec, held) -> np.ndarray:
    """The largest share of MoE blocks among any ``held`` consecutive blocks (per row): what
    the fullest pipeline stage holds when dense and MoE blocks differ (DeepSeek-V3's first
    three dense blocks, ``moe_layer_freq`` > 1), where the mean block would under-count it."""
    moe_at = np.array([model.moe_block(i) for i in range(model.layers)], dtype=np.int64)
    sums = np.concatenate([[0], np.cumsum(moe_at)])

    def share(n: int) -> float:
        n = min(max(n, 1), model.layers)
        return float(np.max(sums[n:] - sums[:-n])) / n

    held = np.asarray(held)
    values = {int(n): share(int(n)) for n in np.unique(held)}
    return np.vectorize(lambda n: values[int(n)], otypes=[float])(held)


def stage_excess_params(model: ModelSpec, t, held, dense_per_rank):
    """Parameters the fullest stage's ``held`` blocks hold on one rank beyond ``held`` mean
    blocks: ``held·(share − φ)`` times an MoE block's excess over a dense one (0 when every
    block is alike)."""
    ep, etp = axes.degree(t, "ep"), axes.expert_tensor_parallel(t)
    block_moe = layer_params_per_rank(model, t.tp, ep, dense_per_rank, 1.0, etp)[0]
    block_dense = layer_params_per_rank(model, t.tp, ep, dense_per_rank, 0.0, etp)[0]
    extra = np.asarray(held) * (stage_moe_share(model, held) - _fraction(model))
    return extra * (block_moe - block_dense), extra * layer_params_per_rank(
        model, t.tp, ep, dense_per_rank, 1.0, etp)[1]


def expert_degree(t, component: str):
    """Sharding degree of the routed experts' ``component``: the layout's degree, at most
    expert-dp = tp·cp·dp/(etp·ep) (only the ranks that hold the same experts can shard them)."""
    return np.minimum(t.degree(component), axes.expert_data_parallel(t))


def sharded_count(n, n_routed, t, component: str):
    """Parameters of ``component`` on one rank: the dense share over the layout's degree, the
    routed experts' share over :func:`expert_degree`."""
    def cdiv(a, b):
        return -(-a // b)
    n_routed = np.ceil(n_routed)
    return cdiv(n - n_routed, t.degree(component)) + cdiv(n_routed, expert_degree(t, component))


def load_imbalance(model: ModelSpec) -> float:
    """Most loaded expert's tokens over the mean: :data:`LOAD_IMBALANCE` dropless; a capacity
    factor ``c`` caps every expert at ``c`` times its even share (GShard, Switch), so
    ``min(LOAD_IMBALANCE, c)``."""
    if model.capacity_factor is None:
        return LOAD_IMBALANCE
    return min(LOAD_IMBALANCE, model.capacity_factor)


def _rank_tokens(model: ModelSpec, t):
    """Tokens of one micro-batch a rank routes: seq/cp per sequence, and 1/tp of them with
    sequence parallelism (Megatron-Core asks sequence parallelism for EP with TP)."""
    tokens = t.micro_batch * t.local_seq(model.seq_len)
    return tokens * np.where(t.sequence_parallel, 1.0 / t.tp, 1.0)


def expert_rows(model: ModelSpec, t):
    """Rows of one local expert's GEMM on the mean EP rank: a rank receives ``tokens·top_k``
    routed tokens of its ep group (``ep`` ranks' tokens for its ``E/ep`` experts), with expert-tp
    the etp group's tokens (Megatron's all-gather over expert-tp): ``tokens·top_k·ep/E`` at tp's
    full micro-batch with etp = tp; ``etp/tp`` of that with a smaller etp, each rank then
    dispatching only its sequence-parallel share (Megatron-Core's MoEAlltoAllTokenDispatcher
    gathers over the expert-tp group only)."""
    tokens = t.micro_batch * t.local_seq(model.seq_len)
    folded = axes.expert_tensor_parallel(t) / t.tp
    return tokens * model.top_k * axes.degree(t, "ep") / model.num_experts * folded


def expert_weight_side(model: ModelSpec, etp) -> np.ndarray:
    """1 / the FLOP-weighted mean ``1/d`` of one expert MLP's weights on one of ``etp`` ranks
    (gemm.inverse_side of its input and output matrices, split like a dense MLP's)."""
    h, f = float(model.hidden), float(model.expert_ffn_hidden)
    etp = np.asarray(etp, dtype=float)
    return 1.0 / gemm.inverse_side([((model.mlp_matrices - 1) * f / etp, h), (h, f / etp)])


def expert_gemm_slowdown(model: ModelSpec, t, half_hidden: float):
    """How much slower than the dense GEMMs an expert GEMM runs, from the cost model's one GEMM
    efficiency law ``d / (d + matmul_half_hidden)`` (:mod:`.gemm`, docs/costmodel.md §5): the
    dense block's GEMMs run as one of side ``d`` = 1 / their FLOP-weighted mean ``1/d`` (their
    TP-split weights); an expert GEMM is one of its own weights, split over expert-tp
    (:func:`expert_weight_side`: ``f_e/etp`` wide), with only its routed tokens as rows, so its
    smallest side is ``min(expert side, rows)``. Fine-grained experts split over tp are the
    skinny GEMMs that make etp 1 the faster fold (torchtitan's reason for dropping ETP, commit
    c4b409af2bc7e9ad162531a708050ef53c79a9fb: "sharding already-skinny expert weights with TP
    is impractical")."""
    side = 1.0 / gemm.inverse_side(gemm.block_weight_shapes(model, t.tp))
    expert_side = expert_weight_side(model, axes.expert_tensor_parallel(t))
    d = np.maximum(np.minimum(expert_side, expert_rows(model, t)), 1.0)
    return gemm.size_factor(side, half_hidden) / gemm.size_factor(d, half_hidden)


def routed_gemm_extra(model: ModelSpec, t, seconds_routed, half_hidden: float):
    """Seconds the slowest EP rank adds to ``seconds_routed`` (its routed-expert GEMMs priced at
    the dense rate and mean load): ``(imbalance · slowdown − 1)`` of them."""
    return seconds_routed * (load_imbalance(model) * expert_gemm_slowdown(model, t, half_hidden)
                             - 1.0)


def all_to_all_bytes(model: ModelSpec, t, act_bytes):
    """Bytes one all-to-all sends from the most loaded rank: its routed copies of the hidden
    states, ``tokens·top_k·h·e`` times the imbalance, of which ``(ep−1)/ep`` leave the rank."""
    ep = axes.degree(t, "ep")
    sent = _rank_tokens(model, t) * model.top_k * model.hidden * act_bytes
    return sent * load_imbalance(model) * (ep - 1) / np.maximum(ep, 1)


def all_to_all_times(model: ModelSpec, system: SystemSpec, t, act_bytes):
    """Exposed all-to-all seconds of the mean block per micro-batch: dispatch and combine
    forward, their transposes backward (4), two more when full recompute replays the forward.
    The ep group is ep consecutive (dp, cp) indices, ranks ``tp`` apart (Megatron's
    tp-cp-ep-dp-pp order), spanning ``tp·ep`` ranks; with an etp below tp, ranks etp apart
    (the folded expert order tp-ep-dp-pp with tp = etp: specs/axes.py expert_stride), so with
    etp 1 an ep group of 8 is 8 consecutive ranks, tp ranks among them. Inside a node it uses
    the node link, across nodes each member's own NIC (comm.all_to_all). Not overlapped:
    Megatron-Core overlaps the EP all-to-all with compute only under
    ``--overlap-moe-expert-parallel-comm`` (off by default; megatron/training/arguments.py),
    torchtitan not at all."""
    ep = axes.degree(t, "ep")
    one = comm.all_to_all(system, ep, axes.expert_stride(t), all_to_all_bytes(model, t, act_bytes))
    count = 4 + np.where(t.recompute == Recompute.FULL.code, 2, 0)
    return _fraction(model) * count * one


def mlp_tp_comm(model: ModelSpec, system: SystemSpec, t, tp_ar, tokens_bytes):
    """The mean block's MLP tensor-parallel collective per micro-batch and direction: the dense
    blocks' ``tp_ar`` (all-reduce over tp, or its all-gather + reduce-scatter with sequence
    parallelism), the MoE blocks' over the etp ranks (consecutive: the expert order's tp is
    innermost) of the ``etp/tp`` share of the tokens they gather (:func:`expert_rows`); none
    with etp 1: the tokens stay in their sequence-parallel share and the all-to-all moves them.
    Equal to ``tp_ar`` with etp = tp. ``tokens_bytes``: the rank's tokens x hidden x bytes."""
    etp = axes.expert_tensor_parallel(t)
    expert = comm.all_reduce(system, etp, 1, tokens_bytes * etp / t.tp)
    frac = _fraction(model)
    # Exactly tp_ar where etp = tp (no rounding of the weighted sum moves a tp-only layout).
    return np.where(etp == t.tp, tp_ar, (1 - frac) * tp_ar + frac * expert)


def activation_extra(model: ModelSpec, t, act_bytes, f_rank):
    """Bytes per token (of the rank's sequence share) the mean block saves beyond a dense block's
    MLP (``mlp_saved·f/t``): an MoE block saves its router's fp32 logits (``4·E``), the
    permuted copies of the hidden state the experts read and the combine weighs
    (``2·top_k·h·e``, dropless: ``top_k`` copies of every token; on the most loaded rank the
    imbalance times that, a capacity factor caps it: :func:`load_imbalance`; ``etp/tp`` of them
    under a smaller etp, which gathers fewer ranks' tokens: :func:`expert_rows`) and the
    ``(top_k + shared)`` experts' intermediates of width ``f_e/t`` (under etp, ``etp/tp`` of
    the rows at ``f_e/etp``: the same bytes)."""
    saved = 2 if model.activation == "gelu" else 4
    load = load_imbalance(model)
    e_rank = model.expert_ffn_hidden / t.tp
    folded = axes.expert_tensor_parallel(t) / t.tp
    moe = (4 * model.num_experts + 2 * load * model.top_k * model.hidden * act_bytes * folded
           + act_bytes * saved * e_rank * (load * model.top_k + model.shared_experts))
    return _fraction(model) * (moe - act_bytes * saved * f_rank)
