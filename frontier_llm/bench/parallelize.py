"""Tensor/sequence parallelism and FSDP2 applied to one pipeline stage (a :class:`GPT`).

The tensor-parallel plan is Megatron's (Shoeybi et al. 2019) written with
``torch.distributed.tensor.parallel``:

* Q, K, V and MLP fc1 (and the SwiGLU gate) column-parallel (whole heads per rank, biases
  sharded); attention out-projection and MLP fc2 row-parallel (biases replicated);
* token embedding vocab-parallel (``RowwiseParallel`` on ``nn.Embedding``: vocab/tp rows);
* output head column-parallel over the vocabulary; the logits stay sharded and the loss is
  the vocab-parallel cross entropy (``loss_parallel``), as in Megatron;
* norms and learned positions replicated.

With sequence parallelism (Korthikanti et al. 2022) the residual stream between blocks is
sharded along the sequence: norms run on s/tp tokens (``SequenceParallel``), the all-reduce after
a row-parallel layer becomes a reduce-scatter and an all-gather precedes each column-parallel one.

FSDP2 (``fully_shard``) then wraps each block and the stage root over the data-parallel mesh
(1-D, or 2-D replicate x shard for HSDP).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from frontier_llm.bench.model import GPT
from frontier_llm.bench.moe import MoE


def tp_plan(model: GPT, sequence_parallel: bool) -> dict:
    """The ``parallelize_module`` plan for the parts this stage holds."""
    sp = sequence_parallel
    plan: dict = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()
        )
        if sp and model.pos_embeddings is not None:
            # Each rank adds the positions of its own sequence chunk; the weight's gradient is
            # gathered back to a replicated one by DTensor.
            plan["pos_embeddings"] = SequenceParallel(use_local_output=True)
    for name, block in model.layers.items():
        p = f"layers.{name}"
        plan[f"{p}.attention.wq"] = ColwiseParallel()
        plan[f"{p}.attention.wk"] = ColwiseParallel()
        plan[f"{p}.attention.wv"] = ColwiseParallel()
        plan[f"{p}.attention.wo"] = RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
        ffn = block.feed_forward
        moe = isinstance(ffn, MoE)
        if moe:
            # Expert-tp = tp (Megatron-Core's and torchtitan's default): every expert this rank
            # holds, and every shared one, split like a dense MLP; the router is replicated,
            # so every tp rank routes the same tokens the same way.
            mlps = [f"experts.{e}" for e in ffn.experts] + [f"shared.{j}" for j in ffn.shared]
        else:
            mlps = [""]
        for mlp in mlps:
            q = f"{p}.feed_forward" + (f".{mlp}" if mlp else "")
            plan[f"{q}.w1"] = ColwiseParallel()
            if ffn.get_submodule(mlp).w3 is not None:
                plan[f"{q}.w3"] = ColwiseParallel()
            # An expert's rows are (tokens, hidden), not (b, s, h): its output is summed whole
            # over tp, and the MoE block's output is cut back to the sequence shard below.
            plan[f"{q}.w2"] = RowwiseParallel(
                output_layouts=Shard(1) if sp and not moe else Replicate())
        if sp:
            plan[f"{p}.attention_norm"] = SequenceParallel()
            plan[f"{p}.ffn_norm"] = SequenceParallel()
            gather = PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),))
            plan[f"{p}.attention"] = gather
            plan[f"{p}.feed_forward"] = moe_sequence_parallel() if moe else gather
    if model.output is not None:
        if sp:
            plan["norm"] = SequenceParallel()
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1)
        )
    return plan


def moe_sequence_parallel() -> PrepareModuleInputOutput:
    """An MoE block under sequence parallelism: each tp rank's s/tp tokens are gathered over
    tp before the router, and the block's output is cut back to this rank's s/tp.

    Megatron-Core routes each rank's s/tp tokens and then gathers the routed tokens over tp
    (its all-gather dispatcher over tp x ep, its all-to-all one over tp after the ep exchange)
    and reduce-scatters the experts' output back (megatron/core/transformer/moe/
    token_dispatcher.py at 0014f137). A token's routing depends on no other token, so gathering
    first assigns the same experts, keeps one routing per tp group as without sequence
    parallelism, and takes a capacity over the whole micro-batch as one process does. The block
    works on plain tensors (its router and index arithmetic are not DTensor code); its input
    gradient arrives whole on every tp rank (the experts' column-parallel inputs all-reduce
    it), so the gather's backward is a slice."""
    return PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)


def apply_tp(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> GPT:
    tied = model.tok_embeddings is not None and model.output is not None and (
        model.output.weight is model.tok_embeddings.weight
    )
    parallelize_module(model, tp_mesh, tp_plan(model, sequence_parallel))
    if tied:
        # Vocab-parallel embedding and column-parallel head shard the same matrix the same way
        # (Shard(0) over the vocabulary), so one DTensor serves both.
        model.output.weight = model.tok_embeddings.weight
    return model


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, reshard_after_forward: bool,
               mp_policy=None, expert_mesh: DeviceMesh | None = None) -> GPT:
    """FSDP2 over ``dp_mesh``: one unit per block, the embeddings/head in the root unit.

    Routed experts split over ep (some rank of ``dp_mesh`` holds other experts) are not the
    block's: each is its own unit over ``expert_mesh``, the expert-dp ranks holding the same
    experts (torchtitan's ``dp_mod_ep`` mesh for its experts, torchtitan/models/llama4/
    infra/parallelize.py), or, with no ``expert_mesh`` (expert-dp 1), left unsharded."""
    offload: OffloadPolicy = OffloadPolicy()
    if dp_mesh.device_type == "cpu":
        # The default offload policy pins host memory, which needs an accelerator.
        offload = CPUOffloadPolicy(pin_memory=False)
    kwargs = {"mesh": dp_mesh, "offload_policy": offload}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    ignored: set = set()
    for block in model.layers.values():
        ffn = block.feed_forward
        if isinstance(ffn, MoE) and ffn.ep is not None:
            for expert in ffn.experts.values():
                if expert_mesh is None:
                    ignored |= set(expert.parameters())
                else:
                    fully_shard(expert, reshard_after_forward=reshard_after_forward,
                                **{**kwargs, "mesh": expert_mesh})
        fully_shard(block, reshard_after_forward=reshard_after_forward,
                    ignored_params=ignored or None, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward,
                ignored_params=ignored or None, **kwargs)
    return model


