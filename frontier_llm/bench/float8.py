"""FP8 linears for ``flm bench --dtype fp8``: torchao's float8 training, torchtitan's path.

The model is built in bf16; every ``nn.Linear`` of its blocks is swapped for torchao's
``Float8Linear`` (tensorwise scaling, ``torchao.float8.convert_to_float8_training``) or, for
``--fp8-recipe mxfp8``, quantized with torchao's MX formats (``MXLinearConfig``, Blackwell /
CDNA4 only), before tensor parallelism and FSDP are applied, as torchtitan's float8 converter
does. The output head stays bf16 (torchtitan filters ``output`` out of the conversion; the cost
model prices it in bf16, costmodel/fp8.py). Under FSDP2 with tensorwise scaling the sharded
weights are all-gathered in float8 (``enable_fsdp_float8_all_gather``), and the scales are
precomputed once per step (:func:`precompute_scales`, torchtitan's
``precompute_float8_dynamic_scale_for_fsdp``).

FP8 needs FP8 tensor cores: a CPU run is refused before any rank starts
(:func:`check_device`). GPU-only code: this machine's tests cannot run it (docs/bench.md).
"""

from __future__ import annotations

from frontier_llm.errors import UserError

# Modules left in bf16: the output head (its vocabulary-wide GEMM and the loss after it).
KEEP_BF16 = ("output",)


def check_device(system_name: str, has_fp8: bool) -> None:
    """Refuse fp8 where the run's system has no FP8 tensor cores (a CPU, an A100, an MI250X)."""
    if not has_fp8:
        raise UserError(
            f"flm bench --dtype fp8 needs a GPU with FP8 tensor cores (H100/H200, B200/GB200, "
            f"MI300X-class) and torchao; this run's system {system_name} has none: run it on "
            "such a GPU, or with --dtype bf16")


def _torchao():
    try:
        import torchao.float8 as float8
    except ImportError:
        raise UserError("flm bench --dtype fp8 uses torchao's float8 training: install torchao "
                        "(pip install 'frontier_llm[fp8]'; on a node without network, carry "
                        "its wheel in gpu-wheels/, docs/gpu.md)") from None
    return float8


def _keep(module, fqn: str) -> bool:
    """torchao's module filter: convert every linear but the output head."""
    return not any(fqn == name or fqn.endswith(f".{name}") for name in KEEP_BF16)


def apply_float8(model, recipe: str, fsdp: bool) -> None:
    """Convert ``model``'s linears in place for ``recipe`` (tensorwise or mxfp8); ``fsdp``:
    the model is about to be sharded with FSDP2 (gather weights in float8)."""
    if recipe == "tensorwise":
        float8 = _torchao()
        config = float8.Float8LinearConfig.from_recipe_name("tensorwise")
        if fsdp:
            import dataclasses

            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
        float8.convert_to_float8_training(model, config=config, module_filter_fn=_keep)
    elif recipe == "mxfp8":
        _torchao()
        from torchao.prototype.mx_formats import MXLinearConfig
        from torchao.quantization import quantize_

        quantize_(model, MXLinearConfig(), filter_fn=lambda m, fqn: _linear(m) and _keep(m, fqn))
    else:  # the native engine's rules refuse the others (costmodel/fp8.py ENGINE_RECIPES)
        raise UserError(f"flm bench's native engine does not run the {recipe} FP8 recipe "
                        "(it runs tensorwise and mxfp8)")


def _linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear)


def precompute_scales(modules, recipe: str, fsdp: bool) -> None:
    """After the optimizer step: one amax all-reduce for every float8 weight (tensorwise under
    FSDP2 only), instead of one per weight in the next forward."""
    if recipe != "tensorwise" or not fsdp:
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for m in modules:
        precompute_float8_dynamic_scale_for_fsdp(m)
