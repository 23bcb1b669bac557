"""ModelSpec: the shape of a GPT-style (or Llama-style) decoder-only transformer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from frontier_llm.errors import SpecError
from frontier_llm.specs.values import check_name

# The largest value of any model dimension (2**24 = 16,777,216: vocabularies reach a few hundred
# thousand, contexts a few million tokens): above it a model file holds a typing mistake, and the
# bound keeps every product of dimensions inside int64 and every enumeration over them short.
MAX_DIMENSION = 2**24
# The most layers: 16 times the deepest transformer trained (DeepNet, Wang et al. 2022,
# arXiv:2203.00555: 1,000 layers; the deepest published LLMs have about 120). The cost model's
# work grows with the layers (a pipeline split, a per-layer memory walk), so a typing mistake of
# 16.7 million layers ran flm plan for 109 s in 8.5 GB before this bound.
MAX_LAYERS = 16_384


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    GPT style (Narayanan et al. 2021): LayerNorm, learned positions, biases, a 4h GeLU MLP.
    Llama style: RMSNorm, rotary positions, no biases, a SwiGLU MLP and grouped-query attention
    (``kv_heads`` < ``heads``).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None  # None means multi-head attention (kv_heads == heads)
    ffn_hidden: int | None = None  # None means 4 * hidden
    activation: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope"] = "learned"
    # RoPE's base, theta in sin/cos(position x theta^(-2i/d)) (Su et al. 2021: 10000). Models
    # raise it for long contexts (Llama 3: 500000, Mixtral: 1e6, their config.json rope_theta).
    # It prices nothing; the exports write it (Megatron-LM --rotary-base, torchtitan rope_theta).
    rope_base: float = 10000.0
    bias: bool = True
    tied_embeddings: bool = False
    # Dropout probability. Megatron-style GPT training uses 0.1; it adds the dropout masks of
    # Korthikanti et al. 2022 §4.1 to the activation memory. Llama trains without it.
    dropout: float = 0.0
    # Mixture-of-Experts blocks (Shazeer et al. 2017; Fedus et al. 2022, Switch Transformers;
    # Jiang et al. 2024, Mixtral; Dai et al. 2024, DeepSeekMoE). A dense model leaves them at
    # their defaults. An MoE block's MLP is ``num_experts`` routed experts, each an MLP of width
    # ``expert_ffn_hidden``, of which a router picks ``top_k`` per token, plus ``shared_experts``
    # that every token passes through; its attention is the dense block's.
    num_experts: int = 0  # routed experts per MoE block (Megatron-LM --num-experts); 0: dense
    top_k: int = 0  # routed experts per token (Megatron-LM --moe-router-topk)
    expert_ffn_hidden: int | None = None  # None: ffn_hidden (Megatron-LM --moe-ffn-hidden-size)
    shared_experts: int = 0  # always-active experts of expert_ffn_hidden each (DeepSeekMoE)
    # The first ``dense_layers`` blocks keep a dense MLP of ffn_hidden (DeepSeek-V3's
    # first_k_dense_replace); of the rest, every ``moe_layer_freq``-th is an MoE block starting
    # with the first (Megatron-LM --moe-layer-freq N: one expert block per N; GLaM and Llama 4
    # interleave with N = 2), the others dense.
    dense_layers: int = 0
    moe_layer_freq: int = 1
    # None: dropless routing (Megatron-Core's default, Mixtral's): every routed token is computed.
    # A factor c caps each expert at c x its even share of the routed tokens (GShard, Switch).
    capacity_factor: float | None = None
    # The router's load-balancing loss coefficient (Switch Transformers eq. 4; Megatron-LM
    # --moe-aux-loss-coeff); 0 trains without it.
    router_aux_loss: float = 0.0
    # How the router keeps the experts' loads even, which sets the slowest EP rank's excess
    # (costmodel/moe.py load_imbalance): "aux-loss" (a balance loss on each micro-batch: GShard,
    # Switch, Megatron-LM's default aux_loss), "aux-loss-global" (the loss on the global batch's
    # counts: Megatron-LM global_aux_loss, Qwen3), "aux-free" (a per-expert routing bias, Wang
    # et al. 2024, arXiv 2408.15664; DeepSeek-V3), "forced" (Megatron-LM
    # --moe-router-force-load-balancing, benchmarks only).
    router_balance: str = "aux-loss"
    # Group-limited routing (DeepSeek-V3 config.json n_group / topk_group; Megatron-LM
    # --moe-router-num-groups / --moe-router-group-topk): experts in n_group groups, each token
    # routed within topk_group of them; 0: unlimited. With a group per node it is node-limited.
    n_group: int = 0
    topk_group: int = 0
    # Attention widths. ``head_dim`` is each head's width (Hugging Face config.json head_dim,
    # Megatron-LM --kv-channels); None: hidden / heads. Qwen3 and gpt-oss set it apart from
    # hidden / heads (Qwen3-235B-A22B: 64 heads of 128 on a 4096 hidden), so Q is then
    # heads x head_dim wide, not hidden.
    head_dim: int | None = None
    # Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2, arXiv 2405.04434 §2.1; their
    # config.json names): a kv_lora_rank above 0 makes every block MLA. Keys and values are
    # rebuilt per head from one latent of kv_lora_rank (plus one shared rope key of
    # qk_rope_head_dim); queries from a latent of q_lora_rank (0: a full-rank query
    # projection, DeepSeek-V2-Lite). Each head's Q·K width is qk_nope_head_dim +
    # qk_rope_head_dim (head_dim then), its V width v_head_dim.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token prediction (Gloeckle et al. 2024; DeepSeek-AI 2024, DeepSeek-V3 report
    # arXiv 2412.19437 §2.2; config.json num_nextn_predict_layers; Megatron-LM --mtp-num-layers):
    # ``mtp_layers`` sequential modules after the last block, each RMSNorms of the hidden state
    # and of the next token's embedding, a 2h -> h projection (eh_proj, no bias), one
    # transformer block of the last block's kind and a final norm, sharing the embedding and
    # the output head (an extra logits pass each). Megatron-Core builds them all on the last
    # pipeline stage's last chunk, with a copy of the embedding there
    # (megatron/core/transformer/multi_token_prediction.py get_mtp_num_layers_to_build,
    # MultiTokenPredictionLayer; models/gpt/gpt_model.py mtp_process; at 309ffca). They train;
    # :meth:`num_params` (the published count) leaves them out, :meth:`mtp_params` counts them.
    mtp_layers: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        # The name reaches exported flag files, TOML and script comments: one printable line.
        check_name(self.name, "name")
        for name in ("layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden",
                     "head_dim"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 1:
                raise SpecError(f"{name} must be at least 1 (got {value})", name)
            if name == "layers" and value > MAX_LAYERS:
                raise SpecError(f"layers must be at most {MAX_LAYERS:,} (got {value}; 16 times "
                                "DeepNet's 1,000, the deepest transformer trained)", name)
            if value > MAX_DIMENSION:
                raise SpecError(f"{name} must be at most {MAX_DIMENSION:,} (got {value})", name)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        self._check_mla()
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise SpecError(f"hidden ({self.hidden}) is not divisible by heads "
                                f"({self.heads}); give head_dim when heads x head_dim is not "
                                "the hidden size", "hidden")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise SpecError(
                f"heads ({self.heads}) is not divisible by kv_heads ({self.kv_heads})", "kv_heads"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise SpecError(f"dropout must be in [0, 1) (got {self.dropout})", "dropout")
        if self.ffn_hidden < 1:
            raise SpecError(f"ffn_hidden must be at least 1 (got {self.ffn_hidden})", "ffn_hidden")
        self._check_experts()

    def _check_mla(self) -> None:
        for name in MLA_FIELDS:
            value = getattr(self, name)
            if not 0 <= value <= MAX_DIMENSION:
                raise SpecError(f"{name} must be in [0, {MAX_DIMENSION:,}] (got {value})", name)
        if not self.kv_lora_rank:
            for name in MLA_FIELDS:
                if getattr(self, name):
                    raise SpecError(f"{name} is set but kv_lora_rank is 0; give kv_lora_rank "
                                    "for multi-head latent attention", name)
            return
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if qk < 1 or self.v_head_dim < 1:
            raise SpecError("multi-head latent attention needs qk_nope_head_dim + "
                            "qk_rope_head_dim and v_head_dim of at least 1", "v_head_dim")
        if self.kv_heads != self.heads:
            raise SpecError(f"multi-head latent attention rebuilds K and V for every head: "
                            f"kv_heads ({self.kv_heads}) must equal heads ({self.heads})",
                            "kv_heads")
        if self.head_dim is not None and self.head_dim != qk:
            raise SpecError(f"head_dim ({self.head_dim}) must be qk_nope_head_dim + "
                            f"qk_rope_head_dim ({qk}) under multi-head latent attention",
                            "head_dim")
        object.__setattr__(self, "head_dim", qk)

    def _check_experts(self) -> None:
        if not 0 <= self.mtp_layers <= MAX_LAYERS:
            raise SpecError(f"mtp_layers must be in [0, {MAX_LAYERS:,}] (got {self.mtp_layers})",
                            "mtp_layers")
        for name in ("num_experts", "top_k", "shared_experts", "dense_layers"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_DIMENSION:
                raise SpecError(f"{name} must be in [0, {MAX_DIMENSION:,}] (got {value})", name)
        if self.num_experts == 0:
            # An MoE field on a dense model is a model file that lost its num_experts line: say
            # so rather than plan a dense model the user did not mean.
            for name, dense in dense_expert_fields().items():
                if getattr(self, name) != dense:
                    raise SpecError(f"{name} is set but num_experts is 0 (a dense model); give "
                                    "num_experts for a Mixture-of-Experts model", name)
            return
        if self.expert_ffn_hidden is None:
            object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
        if not 1 <= self.top_k <= self.num_experts:
            raise SpecError(f"top_k must be between 1 and num_experts ({self.num_experts}) "
                            f"(got {self.top_k})", "top_k")
        if not 1 <= self.expert_ffn_hidden <= MAX_DIMENSION:
            raise SpecError(f"expert_ffn_hidden must be in [1, {MAX_DIMENSION:,}] "
                            f"(got {self.expert_ffn_hidden})", "expert_ffn_hidden")
        if not 1 <= self.moe_layer_freq <= self.layers:
            raise SpecError(f"moe_layer_freq must be between 1 and layers ({self.layers}) "
                            f"(got {self.moe_layer_freq})", "moe_layer_freq")
        if self.dense_layers >= self.layers:
            raise SpecError(f"dense_layers ({self.dense_layers}) leaves no MoE block of "
                            f"{self.layers} layers", "dense_layers")
        if self.router_balance not in ("aux-loss", "aux-loss-global", "aux-free", "forced"):
            raise SpecError("router_balance must be aux-loss, aux-loss-global, aux-free or "
                            f"forced (got {self.router_balance!r})", "router_balance")
        if (self.n_group or self.topk_group) and not (
                1 <= self.topk_group <= self.n_group and self.num_experts % self.n_group == 0):
            raise SpecError(f"topk_group ({self.topk_group}) must be between 1 and n_group "
                            f"({self.n_group}), and n_group divide num_experts "
                            f"({self.num_experts})", "topk_group")
        if self.capacity_factor is not None and not 0.0 < self.capacity_factor <= 1024.0:
            raise SpecError("capacity_factor must be in (0, 1024] or absent for dropless "
                            f"routing (got {self.capacity_factor})", "capacity_factor")
        if not self.rope_base > 1.0:
            raise SpecError(f"rope_base must be above 1 (got {self.rope_base})", "rope_base")
        if not 0.0 <= self.router_aux_loss < 1.0:
            raise SpecError(f"router_aux_loss must be in [0, 1) (got {self.router_aux_loss})",
                            "router_aux_loss")

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (DeepSeek-V2/V3, Kimi K2)."""
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        """Width of Q: heads * head_dim (hidden unless head_dim is set apart)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K: kv_heads * head_dim (of V too, but under MLA: :attr:`v_dim`)."""
        return self.kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of V, which is also the attention output projection's input."""
        return self.heads * self.v_head_dim if self.is_mla else self.kv_dim

    @property
    def out_dim(self) -> int:
        """Width of the attention core's output: the output projection's input."""
        return self.heads * self.v_head_dim if self.is_mla else self.q_dim

    def attention_matrices(self) -> list[tuple[str, int, int, str]]:
        """(name, input width, output width, tensor-parallel split) of each attention weight
        matrix of one block. The split is ``column`` (outputs over tp), ``row`` (inputs over
        tp) or ``whole`` (every rank holds it: MLA's down-projections, as Megatron-Core's
        MLA duplicates them)."""
        h = self.hidden
        if not self.is_mla:
            return [("wq", h, self.q_dim, "column"), ("wk", h, self.kv_dim, "column"),
                    ("wv", h, self.kv_dim, "column"), ("wo", self.q_dim, h, "row")]
        qk = self.heads * self.head_dim
        if self.q_lora_rank:
            q = [("wq_a", h, self.q_lora_rank, "whole"), ("wq_b", self.q_lora_rank, qk, "column")]
        else:
            q = [("wq", h, qk, "column")]
        kv_b = self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return [*q, ("wkv_a", h, self.kv_lora_rank + self.qk_rope_head_dim, "whole"),
                ("wkv_b", self.kv_lora_rank, kv_b, "column"), ("wo", self.out_dim, h, "row")]

    def mla_norm_params(self) -> int:
        """The RMSNorms MLA applies to its query and key-value latents."""
        return self.q_lora_rank + self.kv_lora_rank

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn_hidden in the MLP: 2 for GeLU, 3 for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    @property
    def is_moe(self) -> bool:
        """Whether some blocks are Mixture-of-Experts blocks."""
        return self.num_experts > 0

    def moe_block(self, layer: int) -> bool:
        """Whether block ``layer`` (0-based) has routed experts rather than a dense MLP."""
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer {layer} is outside 0..{self.layers - 1}")
        return (self.is_moe and layer >= self.dense_layers
                and (layer - self.dense_layers) % self.moe_layer_freq == 0)

    @property
    def moe_blocks(self) -> int:
        """How many blocks are MoE blocks."""
        if not self.is_moe:
            return 0
        return -(-(self.layers - self.dense_layers) // self.moe_layer_freq)

    # Parameter counts, split the way pipeline stages and tensor parallelism split them.
    def attention_params(self) -> int:
        """Attention weights and biases of one block plus its two norms."""
        h = self.hidden
        norm = 2 * (2 * h if self.norm == "layernorm" else h) + self.mla_norm_params()
        matrices = self.attention_matrices()
        bias = sum(out for _, _, out, _ in matrices) if self.bias else 0
        return sum(i * o for _, i, o, _ in matrices) + norm + bias

    def mlp_params(self, width: int) -> int:
        """One MLP (a dense block's, or one expert) of hidden width ``width``."""
        bias = (width * (self.mlp_matrices - 1) + self.hidden) if self.bias else 0
        return self.mlp_matrices * self.hidden * width + bias

    def router_params(self) -> int:
        """An MoE block's router: one hidden -> num_experts projection, no bias."""
        return self.hidden * self.num_experts

    def expert_params(self) -> int:
        """Routed-expert parameters of one MoE block: what expert parallelism splits."""
        return self.num_experts * self.mlp_params(self.expert_ffn_hidden)

    def layer_params(self, layer: int | None = None) -> int:
        """Parameters of block ``layer``; None: of the mean block (``total // layers``, exact
        for a dense model, whose blocks are all alike)."""
        if layer is None:
            return sum(self.layer_params(i) for i in range(self.layers)) // self.layers
        if not self.moe_block(layer):
            return self.attention_params() + self.mlp_params(self.ffn_hidden)
        return (self.attention_params() + self.router_params() + self.expert_params()
                + self.shared_experts * self.mlp_params(self.expert_ffn_hidden))

    def active_layer_params(self, layer: int) -> int:
        """Parameters block ``layer`` applies to one token: the router's pick of ``top_k``
        routed experts and the shared ones (all of a dense block's)."""
        if not self.moe_block(layer):
            return self.layer_params(layer)
        return (self.attention_params() + self.router_params()
                + (self.top_k + self.shared_experts) * self.mlp_params(self.expert_ffn_hidden))

    def embedding_params(self) -> int:
        """Token embedding plus learned positions (on the first pipeline stage)."""
        pos = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the output projection (on the last stage; shared when tied)."""
        norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        return norm + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def num_params(self) -> int:
        """Every parameter (an MoE model's total)."""
        return (sum(self.layer_params(i) for i in range(self.layers)) + self.embedding_params()
                + self.head_params())

    def active_params(self) -> int:
        """Parameters one token passes through (an MoE model's active count; a dense model's
        every parameter)."""
        return (sum(self.active_layer_params(i) for i in range(self.layers))
                + self.embedding_params() + self.head_params())

    def norm_params(self) -> int:
        """One norm over the hidden state: a LayerNorm's weight and bias, an RMSNorm's weight."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def mtp_layer_params(self) -> int:
        """One multi-token-prediction module: its block (the last block's kind, Megatron-Core's
        ``get_gpt_mtp_block_spec`` takes ``layer_specs[-1]``), the 2h -> h projection and
        three norms (enorm, hnorm, final_layernorm); the embedding and head are shared."""
        return (self.layer_params(self.layers - 1) + 2 * self.hidden * self.hidden
                + 3 * self.norm_params())

    def mtp_params(self) -> int:
        """The multi-token-prediction modules' parameters (0 without them)."""
        return self.mtp_layers * self.mtp_layer_params()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# The Mixture-of-Experts fields (ModelSpec above).
EXPERT_FIELDS = ("num_experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers",
                 "moe_layer_freq", "capacity_factor", "router_aux_loss", "router_balance",
                 "n_group", "topk_group")


# The multi-head latent attention fields (ModelSpec above); 0 on every other model.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")


def dense_expert_fields() -> dict[str, object]:
    """Each MoE field with the value a dense model has for it: its default."""
    return {f.name: f.default for f in dataclasses.fields(ModelSpec) if f.name in EXPERT_FIELDS}
