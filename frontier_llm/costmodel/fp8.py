"""FP8 training: what runs in 8 bits, what it costs beside the GEMMs, what it holds.

A layout with ``dtype`` fp8 trains as bf16 does, except that every linear layer of a block (QKV,
attention output, the MLP's matrices, a routed expert's) multiplies in FP8 (torchao's
``Float8Linear``, torchtitan's path; TransformerEngine's linears under Megatron-LM's
``--fp8-format hybrid``). Attention's score and value products, the softmax, norms, the MoE
router, the output head and the loss stay in bf16 (torchtitan filters the ``output`` layer out
of the conversion; TransformerEngine converts only its own linear modules), so they keep the bf16
rate. Docs: docs/costmodel.md, "FP8".

- **Rate.** An FP8 GEMM runs at the system's FP8 peak (``mxfp8`` where the recipe is MXFP8) times
  its ``matmul_fp8`` efficiency, a published achievable-matmul measurement where one exists
  (the system file says which), the same size law as bf16 (costmodel/gemm.py).
- **Casts.** Before each GEMM its bf16 operands are scaled and cast to FP8, a memory-bound pass:
  each linear's input in forward and its output gradient in backward, each read in bf16 and
  written in FP8 twice (the row-major copy and the transposed or column-scaled one the weight
  gradient multiplies with: TransformerEngine's ``cast_transpose``, torchao's cast of the
  transposed tensor), 4 bytes per element; current tensorwise scaling first reads the tensor
  once more for its amax (6). Delayed scaling takes its scale from an amax history and fuses
  the amax into the cast; blockwise and MXFP8 scales are per tile, computed inside the cast
  kernel. Each weight is cast the same way: once per micro-batch under torchao (it casts when
  the layer runs), once per step under Megatron-LM, whose TransformerEngine layers are told
  ``is_first_microbatch`` and keep the FP8 weight for the step's later micro-batches (the
  weights do not change between them: TransformerEngine user guide, "Performance
  Optimizations", "FP8 weight caching"; Megatron-Core passes the flag from its TE wrappers,
  megatron/core/extensions/transformer_engine.py). No fusion with the norm before the linear
  is credited (an upper bound for TransformerEngine's ``LayerNormLinear``).
- **Communication.** Parameters are all-gathered in FP8 where the engine does it: torchao's
  ``enable_fsdp_float8_all_gather`` (tensorwise only) under FSDP2, and Megatron-LM's
  ``--fp8-param-gather`` (which flm's export sets): one byte per parameter on the wire.
  Gradients are reduced as in bf16; TP and CP traffic stays bf16.
- **Memory** (:func:`extra_bytes`, added beside the bf16 terms): Megatron-LM /
  TransformerEngine keep an FP8 copy of each weight and its transpose for the step (2 bytes per
  linear parameter the rank holds); torchao casts each weight when its layer runs, so it holds
  two layers' FP8 weights at a time (the running one and the next, gathered ahead; 1 byte a
  parameter). Master weights, gradients and optimizer states are bf16 training's.
- **FP8 parameters** (:func:`fp8_params`): under Megatron-LM's ``--fp8-param-gather`` (NeMo's
  ``fp8_params``, MLPerf's ``FP8_PARAMS=True``) TransformerEngine builds the linear weights
  as FP8 tensors (``fp8_model_init``): the weight itself is the FP8 copy (1 byte a linear
  parameter instead of bf16's 2) and only its cached transpose (1 byte) is held beside it; the
  fp32 master copy lives in the distributed optimizer (``--fp8-param-gather`` asserts it,
  megatron/training/arguments.py), so the optimizer's 12 bytes are unchanged. Embeddings,
  norms and the output head stay bf16 (TransformerEngine converts only its own modules).
- **Saved activations**: TransformerEngine's ``Linear`` and ``LayerNormLinear`` save the FP8
  cast of their input for the weight gradient (``saved_inputmat`` / ``saved_inputmat_t``, the
  FP8 ``ln_out``: transformer_engine/pytorch/module/linear.py and layernorm_linear.py, the 1.x
  releases of NGC 24.09-25.01; the quantized ``inputmat`` of 2.x at 3ec8787), 1 byte an
  element: in Megatron-Core's block those are the QKV and MLP inputs (norm outputs), the
  attention projection's input and the second MLP matrix's input (:func:`linear_input_bytes`).
  Attention, the activation function's input and the norms' inputs stay bf16. torchao saves
  its bf16 inputs and casts again in backward (``Float8Linear``), so its saved activations are
  bf16 training's.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.costmodel.params import kv_width_per_rank, layer_params_per_rank
from frontier_llm.errors import SpecError
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.specs.vocab import DType, Engine, FP8Recipe

# Bytes moved per element cast, by recipe (module docstring): read bf16 (2), write the FP8
# tensor and its transposed / column-scaled copy (1 + 1); current tensorwise scaling reads the
# tensor once more for its amax.
CAST_BYTES = {FP8Recipe.TENSORWISE: 6.0, FP8Recipe.DELAYED: 4.0, FP8Recipe.BLOCKWISE: 4.0,
              FP8Recipe.MXFP8: 4.0}
_CAST = np.array([CAST_BYTES[r] for r in FP8Recipe])

# The recipes each engine runs. torchao: tensorwise (and rowwise, which flm does not model) in
# torchao.float8, MXFP8 in torchao.prototype.mx_formats; no delayed scaling since torchao 0.9
# removed it, no 1x128 blockwise training recipe. Megatron-LM: ``--fp8-recipe`` choices
# tensorwise, delayed, mxfp8, blockwise (megatron/training/arguments.py).
ENGINE_RECIPES = {
    Engine.NATIVE: (FP8Recipe.TENSORWISE, FP8Recipe.MXFP8),
    Engine.MEGATRON: tuple(FP8Recipe),
    Engine.DEEPSPEED: (),
}


def recipe_peak_key(recipe: FP8Recipe | str) -> str:
    """The system's ``peak_flops`` entry a recipe's GEMMs run at."""
    return "mxfp8" if FP8Recipe(recipe) == FP8Recipe.MXFP8 else "fp8"


def check_fp8(system: SystemSpec, dtype: str, recipe: str = "tensorwise",
              engine: str | None = None) -> None:
    """Refuse, in one line, FP8 where the GPU has no FP8 tensor cores (MI250X, A100), a recipe
    its tensor cores lack (MXFP8 before Blackwell / CDNA4) or an engine that does not run it."""
    if DType(dtype) != DType.FP8:
        return
    if "fp8" not in system.peak_flops:
        raise SpecError(
            f"system {system.name} ({system.gpu}) has no FP8 tensor cores (no fp8 peak); "
            "train it in bf16, or plan fp8 on an H100/H200, B200/GB200 or MI300X-class system",
            "dtype")
    key = recipe_peak_key(recipe)
    if key not in system.peak_flops:
        raise SpecError(
            f"system {system.name} ({system.gpu}) has no {recipe} tensor cores (MXFP8 needs "
            "Blackwell or CDNA4); use --fp8-recipe tensorwise, delayed or blockwise", "fp8_recipe")
    if engine is not None:
        runs = ENGINE_RECIPES[Engine(engine)]
        if FP8Recipe(recipe) not in runs:
            raise SpecError(
                f"engine {engine} does not run the {recipe} FP8 recipe (it runs "
                f"{', '.join(runs) or 'no fp8'})", "fp8_recipe")


def is_fp8(t: LayoutTable) -> np.ndarray:
    return t.dtype == DType.FP8.code


def compute_dtype(t: LayoutTable) -> np.ndarray:
    """The dtype code of everything but the linear GEMMs: bf16 for fp8 rows."""
    return np.where(is_fp8(t), DType.BF16.code, t.dtype)


def linear_speedup(system: SystemSpec, t: LayoutTable) -> np.ndarray:
    """How much faster a linear GEMM runs than at the bf16 rate (1 for other rows): the FP8
    peak (per recipe) times ``matmul_fp8`` over the bf16 peak times ``matmul``."""
    fp8 = is_fp8(t)
    if not fp8.any():
        return np.ones(len(t))
    bf16 = system.peak("bf16") * system.eff("matmul")
    rates = np.array([system.peak_flops.get(recipe_peak_key(r), np.nan)
                      for r in FP8Recipe]) * system.eff("matmul_fp8", system.eff("matmul"))
    return np.where(fp8, rates[t.fp8_recipe] / bf16, 1.0)


def cast_bytes_per_microbatch(model: ModelSpec, t: LayoutTable, tokens) -> np.ndarray:
    """Bytes one block's FP8 casts move per micro-batch, forward and backward, on one rank
    (0 for other rows): each linear's input (forward) and output gradient (backward) over the
    rank's ``tokens``, and its weight."""
    h, f, tp = model.hidden, model.ffn_hidden, t.tp
    kv = kv_width_per_rank(model, tp)
    mlp_in = (model.mlp_matrices - 1) * f / tp
    # Inputs: QKV and the MLP's first matrices read the whole (gathered) hidden state, the two
    # row-parallel layers their TP shard; output gradients: each layer's output width.
    inputs = h + model.out_dim / tp + h + f / tp
    grads = (model.q_dim / tp + 2 * kv) + h + mlp_in + h
    weights = layer_params_per_rank(model, tp)
    # Megatron-LM (TransformerEngine) casts a weight on a step's first micro-batch and reuses
    # it for the rest (module docstring), so each micro-batch carries its share of one cast.
    weights = np.where(t.engine == Engine.MEGATRON.code,
                       weights / np.maximum(t.num_microbatches, 1), weights)
    per_elem = _CAST[t.fp8_recipe]
    # A Mixture-of-Experts block's routed experts are cast as the dense MLP above is counted
    # (its widths), not per expert: their GEMMs run at the FP8 rate, their casts are the dense
    # block's (not modelled further: no MoE FP8 run is in the corpus).
    total = per_elem * (tokens * (inputs + grads) + weights)
    return np.where(is_fp8(t), total, 0.0)


def param_gather_bytes(t: LayoutTable, default) -> np.ndarray:
    """Bytes per parameter of a parameter all-gather: 1 where the engine gathers FP8 weights
    (torchao's FSDP2 float8 all-gather, tensorwise only; Megatron-LM's ``--fp8-param-gather``),
    else ``default``."""
    fp8_gather = is_fp8(t) & (
        (t.engine == Engine.MEGATRON.code)
        | ((t.engine == Engine.NATIVE.code) & (t.fp8_recipe == FP8Recipe.TENSORWISE.code)))
    return np.where(fp8_gather, 1, default)


def fp8_params(t: LayoutTable, setting: bool | None = None) -> np.ndarray:
    """Whether each row keeps its linear weights as FP8 parameters (module docstring): Megatron
    FP8 layouts with the distributed optimizer (ZeRO-1 over more than one rank), where
    ``--fp8-param-gather`` can run (arguments.py asserts the distributed optimizer). ``setting``
    None: flm's own export, which writes the flag for every such layout
    (trainers/megatron_lm.py); True/False: what a run states (a calibration row's
    ``fp8_params`` column; Megatron-LM's default is off)."""
    possible = is_fp8(t) & (t.engine == Engine.MEGATRON.code) & (t.degree("optim") > 1)
    return possible if setting is None else possible & bool(setting)


def linear_input_bytes(t: LayoutTable, e) -> np.ndarray:
    """Bytes per element of a linear layer's saved input: 1 where TransformerEngine saves it in
    FP8 (Megatron FP8 rows, module docstring), else the activation dtype's ``e``."""
    return np.where(is_fp8(t) & (t.engine == Engine.MEGATRON.code), 1, e)


def extra_bytes(model: ModelSpec, t: LayoutTable, held, params: bool | None = None
                ) -> np.ndarray:
    """Memory FP8 training holds beyond bf16 training's on a rank holding ``held`` blocks
    (module docstring): TransformerEngine's FP8 weight copies and transposes for the step (only
    the transposes where the weights are FP8 parameters, :func:`fp8_params` with ``params``),
    or torchao's two layers of FP8 weights in flight."""
    linear = layer_params_per_rank(model, t.tp)
    copies = np.where(fp8_params(t, params), 1, 2)
    te = copies * np.asarray(held) * linear
    torchao = np.minimum(np.asarray(held), 2) * linear
    out = np.where(t.engine == Engine.MEGATRON.code, te, torchao)
    return np.where(is_fp8(t), out, 0.0)
