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
  its expert GEMMs run :func:`load_imbalance` times the mean rows (the router's measured
  per-expert spread and the micro-batch's sampling noise, by the number of experts and EP
  ranks), on smaller GEMMs (:func:`expert_gemm_slowdown`); four all-to-alls per MoE block
  and micro-batch (dispatch and combine, forward and backward; :func:`all_to_all_times`),
  each on the link tiers its hops cross (comm.all_to_all), fewer bytes across nodes where
  the dispatcher sends one copy per node under node-limited routing
  (:func:`remote_copy_factor`), hidden behind the other micro-batch's compute where the run
  overlaps them (:class:`MoeRun`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from frontier_llm.costmodel import comm, gemm
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Engine, Recompute
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Load imbalance: the most loaded expert's tokens over the mean, max/mean = 1 + MaxVio.
# Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"
# (arXiv 2408.15664), Table 1: the aux-loss-balanced ("loss-controlled") 1B MoE trains at
# MaxVio_global = 0.72, their loss-free method (a per-expert bias, Megatron-LM
# ``--moe-router-enable-expert-bias``, DeepSeek-V3's router) at 0.04: the excess of the
# hottest expert over the whole validation set. A stated physical ratio per router, never
# fitted (:data:`ROUTER_BALANCES`, :func:`expert_load_spread`).
LOAD_IMBALANCE = 1.72
AUX_FREE_IMBALANCE = 1.04
# The routed experts per MoE layer of the models those MaxVio figures were measured on (Wang et
# al.'s DeepSeekMoE-style 1B and 3B models: 64 routed experts; carried from this file's earlier
# citation, not re-read in this session). A MaxVio is the largest of that many experts' loads,
# so it is the spread of an expert's load times the expected maximum of 64 draws
# (:func:`expert_load_spread`), not a figure for a model with another expert count.
REFERENCE_EXPERTS = 64
# How a model's router is balanced (ModelSpec.router_balance), by what its balance holds even:
# - ``aux-loss``: GShard/Switch's loss on each micro-batch's expert counts, Megatron-LM's
#   default ("aux_loss": "Load balancing loss used in GShard and SwitchTransformer, calculated
#   at micro-batch level"; ``seq_aux_loss`` holds each sample even, finer still;
#   megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM@d98e8a64; at the
#   README benchmarks' commits c230e0d7 and fbdc9167 the router's apply_load_balancing_loss
#   takes the micro-batch's num_local_tokens_per_expert). The loss is least at an even spread
#   (Switch Transformers, Fedus et al. 2022, eq. 4: "minimized under a uniform distribution";
#   quoted from memory, not re-read in this session), and it sees exactly the counts an EP
#   rank's load is made of, so a settled router leaves a micro-batch only its sampling noise;
#   Qiu et al. 2025 (arXiv 2501.11873, abstract): with the micro-batch loss "the router is
#   pushed to distribute the token evenly within each sequence". A settled router: the
#   Megatron-LM MoE README measures after "at least 500 iterations or resume from trained
#   checkpoints" (NVIDIA/Megatron-LM@c230e0d7). The sampling noise is a floor: what the loss
#   leaves beyond it at the run's coefficient (Megatron-LM's README recommends 1e-2,
#   Mixtral's config 0.02) has no measured source here and is priced as none.
# - ``aux-loss-global``: the same loss on the global batch's counts (Megatron-LM
#   ``global_aux_loss``, "calculated at global batch level", same file; Qwen3, Qiu et al.:
#   "Global-batch LBL is also used in Qwen3-MoEs"): even over the corpus, not within a
#   micro-batch, so a micro-batch keeps the spread of a loss-balanced router over the corpus,
#   Wang et al.'s loss-controlled MaxVio (a lower bound on its micro-batch excess).
# - ``aux-free``: the bias of Wang et al. (DeepSeek-V3 §2.1.2), their measured MaxVio.
# - ``forced``: Megatron-LM ``--moe-router-force-load-balancing``: random router logits,
#   "only for benchmark" (same file): the tokens are spread at random, sampling noise alone.
ROUTER_BALANCES = ("aux-loss", "aux-loss-global", "aux-free", "forced")
# How the run overlaps the expert-parallel all-to-alls with compute (:class:`MoeRun`).
MOE_OVERLAPS = ("none", "ep-a2a", "dualpipe")
# Megatron-LM's ``--moe-token-dispatcher-type`` for expert parallelism: ``alltoall`` sends one
# copy per routed expert; ``flex`` (DeepEP, DeepSeek's kernels) sends a token once to each
# node it is routed to and forwards it over NVLink inside the node (DeepSeek-V3 report
# §3.2.2, arXiv 2412.19437).
MOE_DISPATCHERS = ("alltoall", "flex")


@dataclass(frozen=True)
class MoeRun:
    """How a run executes its MoE blocks' token exchange, a planning setting like
    ``--tp-comm-overlap`` (``flm plan/predict --moe-overlap --moe-dispatcher``).

    ``overlap``: ``none`` (Megatron-LM's default: ``overlap_moe_expert_parallel_comm: bool =
    False``, megatron/core/model_parallel_config.py, NVIDIA/Megatron-LM@d98e8a64; torchtitan
    does not overlap them); ``ep-a2a``: Megatron-LM ``--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute`` ("Overlap EP A2A communications with independent computations of
    different micro-batches in 1f1b phase", same file; MCore v0.14): a micro-batch's
    all-to-alls hide behind the paired micro-batch's compute in the steady phase, exposed in
    the unpaired warm-up and cool-down; ``dualpipe``: DeepSeek-V3's DualPipe (report §3.2.1:
    "both all-to-all and PP communication can be fully hidden"), every micro-batch paired,
    with its node-deduplicating dispatch, and its bidirectional pipeline: each rank holds a
    stage and its mirror, the bubble DualPipe's (:func:`dualpipe_pace`,
    :func:`dualpipe_bubble_share`; steptime.stage_times). ``dispatcher``:
    :data:`MOE_DISPATCHERS`."""

    overlap: str = "none"
    dispatcher: str = "alltoall"

    def __post_init__(self) -> None:
        if self.overlap not in MOE_OVERLAPS:
            raise ValueError(f"moe overlap must be one of {', '.join(MOE_OVERLAPS)} "
                             f"(got {self.overlap!r})")
        if self.dispatcher not in MOE_DISPATCHERS:
            raise ValueError(f"moe dispatcher must be one of {', '.join(MOE_DISPATCHERS)} "
                             f"(got {self.dispatcher!r})")

    @property
    def per_node_copies(self) -> bool:
        """Whether a token crosses the network once per destination node (DeepEP's
        internode dispatch, DualPipe's kernels), not once per routed expert."""
        return self.dispatcher == "flex" or self.overlap == "dualpipe"


NO_OVERLAP = MoeRun()


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


def stage_excess_params(model: ModelSpec, t, held, dense_per_rank, moe_held=None):
    """Parameters a stage's ``held`` blocks hold on one rank beyond ``held`` mean blocks:
    ``(moe_held − held·φ)`` times an MoE block's excess over a dense one (0 when every block is
    alike). ``moe_held``: the MoE blocks among them (costmodel/split.py rank_moe_blocks, the
    stage's own: dense first blocks on the first stage); None: the fullest window of ``held``
    consecutive blocks (:func:`stage_moe_share`)."""
    ep, etp = axes.degree(t, "ep"), axes.expert_tensor_parallel(t)
    block_moe = layer_params_per_rank(model, t.tp, ep, dense_per_rank, 1.0, etp)[0]
    block_dense = layer_params_per_rank(model, t.tp, ep, dense_per_rank, 0.0, etp)[0]
    if moe_held is None:
        moe_held = np.asarray(held) * stage_moe_share(model, held)
    extra = np.asarray(moe_held) - np.asarray(held) * _fraction(model)
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


def expected_max(n):
    """The expected largest of ``n`` independent standard normal draws, to leading order:
    ``sqrt(2·ln n)``, the maximal inequality for sub-Gaussian variables (an upper bound for
    every ``n``, tight as ``n`` grows: Boucheron, Lugosi and Massart 2013, Concentration
    Inequalities, §2.5), 0 for ``n`` = 1."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return np.sqrt(2 * np.log(n))


def expert_load_spread(model: ModelSpec) -> float:
    """The relative standard deviation of one expert's routed load in a micro-batch beyond
    its sampling noise, under the model's router balancing (:data:`ROUTER_BALANCES`): 0 where
    the balance holds each micro-batch even (``aux-loss``) or routes at random (``forced``);
    else the spread behind a measured MaxVio, the largest excess of :data:`REFERENCE_EXPERTS`
    experts' loads: ``MaxVio / sqrt(2·ln 64)`` (:func:`expected_max`), 0.25 for Wang et al.'s
    loss-controlled 0.72 (``aux-loss-global``), 0.014 for their loss-free 0.04
    (``aux-free``)."""
    peak = {"aux-loss": 1.0, "aux-loss-global": LOAD_IMBALANCE,
            "aux-free": AUX_FREE_IMBALANCE, "forced": 1.0}[model.router_balance]
    return float((peak - 1.0) / expected_max(REFERENCE_EXPERTS))


def load_imbalance(model: ModelSpec, t=None):
    """The slowest rank's routed tokens over the mean. Each expert's load deviates from the
    mean by a relative :func:`expert_load_spread` ``s`` (the router's lasting preference, a
    property of its balancing), and a micro-batch's routed copies add sampling noise.

    Without a layout ``t``: the most loaded of the model's ``E`` experts,
    ``1 + s·sqrt(2·ln E)`` (:func:`expected_max`), the measured MaxVio for a 64-expert model.
    With one, per EP rank: a rank holding all experts (ep 1) computes every routed copy, 1;
    else a rank's ``E/ep`` experts average their deviations, ``s·sqrt(ep/E)`` (independent
    experts), and its ``μ = tokens·top_k`` routed copies of the ep group's tokens are binomial
    with ``σ²/μ² = (1 − 1/ep)/μ``; the two add in quadrature and the slowest of the ``ep``
    ranks sits ``sqrt(2·ln ep)`` standard deviations above the mean. A micro-batch balance
    loss and forced (random) routing are the case ``s`` = 0: sampling noise alone. A capacity
    factor ``c`` caps every expert at ``c`` times its even share (GShard, Switch):
    ``min(·, c)``."""
    spread = expert_load_spread(model)
    if t is None:
        imbalance = 1.0 + spread * float(expected_max(model.num_experts))
    else:
        ep = np.maximum(np.asarray(axes.degree(t, "ep"), dtype=float), 1.0)
        mean = np.maximum(t.micro_batch * t.local_seq(model.seq_len) * model.top_k, 1.0)
        rank = np.sqrt(spread ** 2 * np.minimum(ep / model.num_experts, 1.0)
                       + (1 - 1 / ep) / mean)
        imbalance = np.where(ep > 1, 1.0 + rank * expected_max(ep), 1.0)
    if model.capacity_factor is None:
        return imbalance
    return np.minimum(imbalance, model.capacity_factor)


def remote_copy_factor(model: ModelSpec, system: SystemSpec, t, run: MoeRun = NO_OVERLAP):
    """Share of the per-expert copies that cross the network when the dispatcher sends a token
    once per destination node (:attr:`MoeRun.per_node_copies`); 1 otherwise. The ep group
    spans ``D`` scale-up domains (``k`` members each, ranks expert-tp apart); ``top_k`` experts
    picked evenly reach ``D·(1 − (1 − 1/D)^top_k)`` distinct domains, at most ``topk_group``
    under node-limited routing (DeepSeek-V3: ``n_group`` 8, ``topk_group`` 4, "each token will
    be sent to at most 4 nodes", report §2.1.2; Megatron-LM ``--moe-router-num-groups`` and
    ``--moe-router-group-topk``, "Node-limited routing: Set 'moe_router_num_groups' equal to
    number of nodes in EP group", transformer_config.py, NVIDIA/Megatron-LM@d98e8a64): the
    factor is that count over ``top_k``."""
    if not run.per_node_copies:
        return 1.0
    ep = np.asarray(axes.degree(t, "ep"))
    stride = np.asarray(axes.expert_stride(t))  # tp, or etp where the experts fold below it
    k = np.clip(system.scale_up_domain // np.maximum(stride, 1), 1, np.maximum(ep, 1))
    domains = np.maximum(np.ceil(ep / k), 1.0)
    distinct = domains * (1 - (1 - 1 / domains) ** model.top_k)
    if model.n_group and model.topk_group:
        distinct = np.minimum(distinct, model.topk_group)
    return np.where(domains > 1, distinct / model.top_k, 1.0)


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
    return seconds_routed * (load_imbalance(model, t)
                             * expert_gemm_slowdown(model, t, half_hidden) - 1.0)


def all_to_all_bytes(model: ModelSpec, t, act_bytes):
    """Bytes one all-to-all sends from the most loaded rank: its routed copies of the hidden
    states, ``tokens·top_k·h·e`` times the imbalance, of which ``(ep−1)/ep`` leave the rank."""
    ep = axes.degree(t, "ep")
    sent = _rank_tokens(model, t) * model.top_k * model.hidden * act_bytes
    return sent * load_imbalance(model, t) * (ep - 1) / np.maximum(ep, 1)


def all_to_all_times(model: ModelSpec, system: SystemSpec, t, act_bytes,
                     run: MoeRun = NO_OVERLAP, block_compute=None):
    """Exposed all-to-all seconds of the mean block per micro-batch: dispatch and combine
    forward, their transposes backward (4), two more when full recompute replays the forward.
    The ep group is ep consecutive (dp, cp) indices, ranks ``tp`` apart (Megatron's
    tp-cp-ep-dp-pp order), spanning ``tp·ep`` ranks; with an etp below tp, ranks etp apart
    (the folded expert order tp-ep-dp-pp with tp = etp: specs/axes.py expert_stride), so with
    etp 1 an ep group of 8 is 8 consecutive ranks, tp ranks among them. Each hop is priced on
    the tier it crosses (comm.all_to_all: NVLink inside the scale-up domain, the member's NIC
    beyond it), the network part scaled by :func:`remote_copy_factor`.

    Overlap (:class:`MoeRun`): ``none`` exposes them all. ``ep-a2a`` and ``dualpipe`` pair
    each micro-batch's blocks with another's, whose compute (``block_compute``, one block's
    forward + backward + recompute) hides the all-to-alls up to its length; under ``ep-a2a``
    the ``min(1, pp/m)`` of the micro-batches in the 1F1B warm-up and cool-down (and, without
    a pipeline, the first and last) have no partner and stay exposed, and only Megatron-LM
    layouts take it (the flag is Megatron-LM's)."""
    ep = axes.degree(t, "ep")
    one = comm.all_to_all(system, ep, axes.expert_stride(t),
                          all_to_all_bytes(model, t, act_bytes),
                          remote_copy_factor(model, system, t, run))
    count = 4 + np.where(t.recompute == Recompute.FULL.code, 2, 0)
    total = _fraction(model) * count * one
    if run.overlap == "none" or block_compute is None:
        return total
    paired = np.maximum(total - block_compute, 0.0)
    if run.overlap == "dualpipe":
        return paired
    unpaired = np.minimum(1.0, np.asarray(t.pp) / np.maximum(t.num_microbatches, 1))
    # Only Megatron-LM has the flag: other engines' layouts keep every all-to-all exposed.
    return np.where(t.engine == Engine.MEGATRON.code,
                    unpaired * total + (1 - unpaired) * paired, total)


def dualpipe_pace(ranks: dict, per_layer, last_extra):
    """(blocks, head) per micro-batch on the pipeline rank that sets DualPipe's pace.

    DualPipe runs the model in both directions at once: rank ``r`` holds stage ``r`` and stage
    ``P−1−r`` (deepseek-ai/DualPipe example.py@a96f82988ee38d8dbd22ab8550f90fcea33c860e:
    ``nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``; its
    README@89f5de17's table: Parameter "2×"), and each direction carries half the
    micro-batches (the first rank feeds ``full_x.chunk(2)[0]``, the last ``chunk(2)[1]``). A
    rank's work per micro-batch is the mean of its two stages': the end ranks pair the first
    stage with the last, whose head, loss and MTP modules (``last_extra``) they share, half a
    micro-batch each; every middle pair is two middle stages, at most ``mid_held`` blocks
    each (costmodel/split.py pipeline_ranks)."""
    ends = (ranks["first"] + ranks["last"]) / 2.0
    mid = ranks["mid_held"]
    ends_pace = ends * per_layer + last_extra / 2.0 >= mid * per_layer
    return (np.where(ends_pace, ends, mid).astype(float),
            np.where(ends_pace, last_extra / 2.0, 0.0))


def dualpipe_stages(pp, rank):
    """(stage ``h``, stage ``P−1−h``): the two stages DualPipe's pipeline rank ``rank`` holds,
    ``h = min(rank, P−1−rank)`` its ``half_rank`` (deepseek-ai/DualPipe example.py@a96f8298:
    ``nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``; dualpipe.py
    ``half_rank``): ranks ``r`` and ``P−1−r`` hold the same two, the end ranks stage 0 (the
    embedding) and stage ``P−1`` (the head and MTP modules)."""
    pp, rank = np.asarray(pp), np.asarray(rank)
    h = np.minimum(rank, pp - 1 - rank)
    return h, pp - 1 - h


def dualpipe_in_flight(pp, micro_batches, half_rank):
    """(micro-batches of stage ``h``, of stage ``P−1−h``) whose activations DualPipe's rank
    of ``half_rank`` ``h`` holds at its peak, ``P + 1`` in all: the README@89f5de17's
    "Activation Per Device" (``PP`` for 1F1B, ``PP+1`` for DualPipe, in micro-batches of one
    stage) split over the two stages as deepseek-ai/DualPipe dualpipe.py's ``step`` builds it:
    step 1 runs ``2(P/2 − h − 1)`` forwards of phase 0 (stage ``h``, the direction in which
    the rank is ``h`` stages from the input), step 2 ``h + 1`` forwards of each phase, step 3
    a backward then a forward of phase 1, and step 4's first ``F0`` (overlapped with ``B1``)
    holds ``P − h`` of stage ``h`` beside ``h + 1`` of stage ``P−1−h`` — 1F1B's ``p − r`` of
    each stage, on one rank. Each direction carries half the micro-batches (DualPipe asserts
    ``num_chunks >= 2·P``; fewer are capped at ``m/2``)."""
    half = np.maximum(np.asarray(micro_batches) // 2, 1)
    h = np.asarray(half_rank)
    return np.minimum(half, np.asarray(pp) - h), np.minimum(half, h + 1)


def dualpipe_bubble_share(pp):
    """DualPipe's bubble in units of one micro-batch's stage time ``F + B`` (steptime.
    stage_times' ``t_avg``, whose 1F1B bubble is ``(P − 1)`` of them): ``(P/2 − 1)(F&B + B −
    3W)`` against 1F1B's ``(P − 1)(F + B)`` (deepseek-ai/DualPipe README@89f5de17, "Pipeline
    Bubbles and Memory Usage Comparison"), with a backward twice a forward (``B = 2F``), half
    of it the weight gradients (``W = F``: each GEMM's input and weight gradients cost one
    forward each) and the overlapped pair computing both (``F&B = F + B``; the overlap hides
    communication, not FLOPs): ``(P/2 − 1)·2F = (P/2 − 1)·(2/3)·(F + B)``."""
    pp = np.asarray(pp, dtype=float)
    return np.maximum(pp / 2.0 - 1.0, 0.0) * 2.0 / 3.0


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
    load = load_imbalance(model, t)
    e_rank = model.expert_ffn_hidden / t.tp
    folded = axes.expert_tensor_parallel(t) / t.tp
    moe = (4 * model.num_experts + 2 * load * model.top_k * model.hidden * act_bytes * folded
           + act_bytes * saved * e_rank * (load * model.top_k + model.shared_experts))
    return _fraction(model) * (moe - act_bytes * saved * f_rank)
