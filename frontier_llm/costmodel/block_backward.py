"""The native engine's second backward moment under FSDP2: a block's own backward.

The cost model prices the native engine's backward at the loss (costmodel/memory.py
``rank_memory``): every saved activation alive, the loss's vocabulary-sized temporaries, no
parameter gathered (the root's pre-backward hook fires only when the gradient reaches the
logits). Under FSDP2 with its parameters resharded after forward there is a second moment, in
each block's backward, that nothing at the loss holds (torch 2.13,
``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` at cf30153):

- ``pre_backward`` unshards the block (its parameters gathered, ``n_layer`` elements) and
  ``_backward_prefetch`` issues the all-gather of the block run before it in forward, whose
  output is freed only at that block's own copy-out (``wait_for_unshard``): a second block of
  gathered parameters in every block's backward but the first block's;
- the root unit (embeddings, final norm, head) was unsharded at the head's backward and is
  resharded only at the root's ``post_backward``, after the embedding's backward;
- ``post_backward`` reduce-scatters the block's unsharded gradient and keeps the
  reduce-scatter input in ``reduce_scatter_states`` until the next block's ``post_backward``
  (``reduce_scatter_max_input_buffers`` 1): a block of gradients in every block's backward but
  the last block's (the first to run), whose reduce-scatter outputs, the sharded gradients, are
  held from then on;
- the root's unsharded gradient of the head's weight (the output matrix, or the embedding
  it is tied to: ``V/t x h``), made by the head's backward, before any block's, and held in
  the parameter's ``.grad`` until the root's ``post_backward`` (with accumulation too: FSDP2
  moves the ``.grad`` aside at ``post_backward``, ``to_accumulated_grad_if_needed``, so each
  micro-batch's backward makes a new one);
- the block's backward temporaries at its MLP's backward, the block's largest: the gradient
  of its output (autograd's input to the block's backward), the MLP's ``f/t``-wide input
  gradients (``mlp_backward_bytes``) and the gradient of its last matrix (``w2``, the first
  of the block's weight gradients; the others come after the MLP's tensors are freed);
- under full or op-level recompute the rebuilt block's tensors: the reentrant checkpoint
  (``torch/utils/checkpoint.py`` ``CheckpointFunction.backward``) reruns the block's forward
  inside the block's backward, after FSDP2's pre-backward hook gathered it, and its saved
  tensors live until the block's backward is done.

Of the activations only the checkpointed inputs of the block in backward and of the blocks
before it remain (the later blocks' are freed by their backwards; the head's by its own).
Block ``i`` of ``L`` (backward runs ``L-1`` down to 0) holds ``L-1-i`` blocks' sharded
gradients, a prefetched block when ``i > 0`` and a reduce-scatter input when ``i < L-1``: over
``i`` the total is linear between ``i = 1`` and ``i = L-2``, so the largest is at one of
``0, 1, L-2, L-1``, which are evaluated. Measured by flm memcheck module by module
(tests/test_memcheck_grid.py, docs/costmodel.md "Memory as the allocator sees it"): on GPT
22B tp 2 the temporaries before a block's backward are the head's gradient and the output's
(0.34 GiB), and at its peak 0.43 GiB more than the micro-batch's tokens account for (the
head's and ``w2``'s gradients, 0.29 + 0.14).

With resharding off (``reshard_after_forward=False``, and ZeRO-2) every parameter of the
stage stays gathered from forward to backward, which the loss's moment already counts; each
block is resharded after its own backward (``reshard_after_backward``, on by default), so
block ``i``'s moment holds the root and blocks ``0..i`` gathered, its gradients, the
reduce-scatter input and its temporaries: the last block's moment is the larger.

Priced for FSDP2 and HSDP without a pipeline: torch's PipelineStage keeps an FSDP2 stage's
blocks gathered after every backward but its last (``backward_maybe_with_nosync``), a
different moment not priced here. Nor Mixture-of-Experts blocks (routed experts' gradients
and all-to-all buffers in a block's backward, not measured). Nor the native engine's block
moments without sharded
gradients (replicas hold no gathered copy; the loss's or the step's moment is the larger on
every such layout measured), nor Megatron-LM's or DeepSpeed's, which keep their own buffers.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.specs.layout import Engine


def mlp_backward_bytes(model, t: LayoutTable, act_bytes) -> np.ndarray:
    """One block's MLP backward temporaries: the gradients of its ``f/t``-wide intermediates
    (SwiGLU's gate, up and product; GELU's input and output), measured by flm memcheck."""
    wide = 3 if model.activation == "swiglu" else 2
    f = model.expert_ffn_hidden * model.top_k if model.is_moe else model.ffn_hidden
    return wide * t.local_seq(model.seq_len) * t.micro_batch * (f // t.tp) * act_bytes


def priced(model, t: LayoutTable) -> np.ndarray:
    """Rows whose block-backward moment this module prices: the native engine, its
    gradients sharded (FSDP2 or HSDP; ZeRO-2 is FSDP2 keeping its parameters gathered), one
    pipeline stage, dense blocks."""
    return ((t.engine == Engine.NATIVE.code) & (t.degree("grads") > 1) & (t.pp == 1)
            & (not model.is_moe))


def block_moment(*, layers, block_params, rest_params, grad_shard_bytes, act_bytes,
                 per_layer, steady, transient, grad_in, mlp_temps, weight_grads, grads_back,
                 loss_buffers, earlier, reduces_each, kept) -> dict[str, np.ndarray]:
    """The largest block-backward moment's terms (``grads``, ``activations``, ``loss`` for the
    temporaries, ``buffers``), per row.

    ``layers``: blocks on the rank; ``block_params`` / ``rest_params``: a block's parameters
    and the root's (embeddings, norm, head) on the rank, unsharded; ``grad_shard_bytes``: one
    block's sharded gradient; ``per_layer``: what one block keeps for backward; ``steady``:
    every block's plus the first stage's inputs (the activations without the head's or a
    rebuilt block's); ``transient``: a rebuilt block's tensors beyond what it kept;
    ``grad_in``: the gradient of a block's output; ``mlp_temps``: :func:`mlp_backward_bytes`;
    ``weight_grads``: the unsharded weight gradients made by then (the head's and ``w2``'s);
    ``grads_back``: the gradients held at the loss moment; ``loss_buffers``: the unsharded
    copies held at the loss moment (gradients accumulated over earlier micro-batches);
    ``earlier``: an earlier micro-batch's backward ran before; ``reduces_each``: the engine
    reduce-scatters after every micro-batch; ``kept``: every parameter of the stage stays
    gathered from forward to backward (in ``loss_buffers``: nothing is gathered or prefetched
    again)."""
    e = act_bytes
    block = block_params * e
    root = rest_params * e
    # With gradients accumulated unsharded from an earlier micro-batch (``loss_buffers``), a
    # block's reduce-scatter input replaces its accumulated gradient, which is freed: nothing
    # more; its sharded gradient is in ``grads_back`` when the engine reduces every
    # micro-batch.
    reduces_now = ~earlier | reduces_each
    best = None
    last = layers - 1
    for i in (np.zeros_like(last), np.minimum(1, last), np.maximum(last - 1, 0), last):
        later = last - i
        terms = {
            "grads": grads_back + np.where(earlier, 0, later * grad_shard_bytes),
            "activations": steady - later * per_layer,
            "loss": transient + grad_in + mlp_temps + weight_grads,
            # Kept: the stage gathered since its forward, less the later blocks, resharded
            # after their backward (``reshard_after_backward``, on by default).
            "buffers": (loss_buffers
                        + np.where(kept, -later * block,
                                   root + block + np.where(i > 0, block, 0))
                        + np.where((i < last) & reduces_now, block, 0)),
        }
        total = sum(terms.values())
        if best is None:
            best, best_total = terms, total
            continue
        bigger = total > best_total
        best = {k: np.where(bigger, terms[k], best[k]) for k in best}
        best_total = np.where(bigger, total, best_total)
    return best
