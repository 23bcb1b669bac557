"""DeepSpeedEngine: one rank of a layout run by DeepSpeed (ZeRO 0-3, PipelineModule, TP).

Tensor parallelism: AutoTP training without pipelines; with pipelines Megatron-DeepSpeed's way,
each pipeline piece holding this TP rank's slices (``tp_layers.py``) and PipelineModule's grid
as the mpu (DeepSpeed takes no other with a PipelineModule).

The same GPT layers as the native engine (``model.py``, weights keyed by parameter name), the
same data (``data.py``), a torch ``Adam`` with the native engine's hyper-parameters (not
DeepSpeed's FusedAdam, which JIT-compiles for about 50 s on CPU: machine-notes), and the config
from :func:`~frontier_llm.bench.deepspeed_config.deepspeed_config`. ``bench/run.py`` drives it
exactly as it drives :class:`~frontier_llm.bench.engine.NativeEngine` (``step``,
``state_bytes``, ``activations_peak_bytes``, ``coords``, ``has_last``): timing, trace, status
and out-of-memory handling are run.py's, not repeated here.

Rank layout: DeepSpeed's ``PipeModelDataParallelTopology`` orders ranks (pipe, data, model),
model (TP) innermost: rank = (pp·dp + d)·tp + t, the native mesh's order, so a rank has the same
coordinates under both engines.

Model-state bytes are read from DeepSpeed's own containers after the first optimizer step (see
:meth:`DeepSpeedEngine.state_bytes`); where they differ from the cost model's ZeRO accounting,
``costmodel/deepspeed_buffers.py`` models the difference (docs/costmodel.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch
from torch import nn

from frontier_llm.bench.activations import SavedTensorMeter
from frontier_llm.bench.data import TokenSource
from frontier_llm.bench.deepspeed_config import deepspeed_config
from frontier_llm.bench.engine import LR, RankState, run_batch
from frontier_llm.bench.model import build_model, loss_fn
from frontier_llm.bench.placement import engine_local_rank
from frontier_llm.bench.tp_layers import TPGroup, shard_model, vocab_parallel_loss
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec

BETAS, EPS = (0.9, 0.95), 1e-8


def coords_of(layout: Layout, rank: int) -> dict[str, int]:
    """(pp, dp, tp) coordinates of ``rank`` in DeepSpeed's (pipe, data, model) topology: the
    mesh order of ``specs.axes`` at cp 1, the only cp DeepSpeed runs (engine_rules)."""
    return axes.coords(rank, layout)


class GPTPiece(nn.Module):
    """One entry of the PipelineModule's layer list: the embeddings, one block or the head, each
    a :class:`GPT` holding only that part (weights keyed by name: the reference's values)."""

    def __init__(self, spec: ModelSpec, layer_ids: list[int], first: bool, last: bool, *,
                 seed: int, dtype: str, device: str, flash: bool, recompute: str,
                 tp: TPGroup | None = None) -> None:
        super().__init__()
        self.gpt = build_model(spec, seed=seed, dtype=dtype, device=device, layer_ids=layer_ids,
                               first=first, last=last, flash=flash, recompute=recompute)
        if tp is not None:
            # Megatron-DeepSpeed's way: this TP rank's slices as plain parameters (tp_layers.py).
            shard_model(self.gpt, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gpt(x)


def piece_args(spec: ModelSpec) -> list[tuple[list[int], bool, bool]]:
    """(layer_ids, first, last) of each pipeline piece: embeddings, the blocks, the head."""
    return ([([], True, False)] + [([i], False, False) for i in range(spec.layers)]
            + [([], False, True)])


def piece_params(spec: ModelSpec) -> list[int]:
    """Parameters of each piece, as DeepSpeed's ``partition_method='parameters'`` counts them
    (built on the meta device: no memory)."""
    from frontier_llm.bench.model import GPT

    with torch.device("meta"):
        return [sum(p.numel() for p in GPT(spec, layer_ids=ids, first=f, last=la).parameters())
                for ids, f, la in piece_args(spec)]


def pipeline_parts(spec: ModelSpec, pp: int) -> list[int]:
    """DeepSpeed's piece boundaries for ``pp`` stages (``PipelineModule.parts``): what
    ``_partition_layers('parameters')`` computes, through DeepSpeed's own function."""
    from deepspeed.runtime.utils import partition_balanced

    return list(partition_balanced(weights=piece_params(spec), num_parts=pp))


def stage_blocks(spec: ModelSpec, pp: int) -> list[list[int]]:
    """Transformer layers on each pipeline stage under DeepSpeed's partition."""
    parts = pipeline_parts(spec, pp)
    pieces = piece_args(spec)
    return [[i for ids, _, _ in pieces[parts[s]:parts[s + 1]] for i in ids] for s in range(pp)]


@functools.cache
def _balanced_pipeline_module() -> type:
    """The PipelineModule subclass below (a function: deepspeed is imported only when used)."""
    from deepspeed.pipe import PipelineModule

    class BalancedOnModel(PipelineModule):
        """PipelineModule whose ``partition_method='parameters'`` weighs each piece by the
        whole model's parameter count (``piece_params``) rather than by building every piece on
        every rank: the same counts without tensor parallelism, and with it the split the cost
        model assumes (``pipeline_split``), the same on every TP rank."""

        def __init__(self, counts: list[int], **kwargs) -> None:
            self._piece_counts = list(counts)
            self.tied_weights: list[tuple[nn.Parameter, object]] = []
            super().__init__(**kwargs)

        def _count_layer_params(self) -> list[int]:
            return list(self._piece_counts)

        def get_tied_weights_and_groups(self):
            # The pipeline engine's ReduceTiedGrads instruction all-reduces each weight's
            # gradient over its group before the data-parallel reduction: with
            # ``tied_weights`` (see _tie_embeddings) the embedding and head copies too.
            return [*super().get_tied_weights_and_groups(), *self.tied_weights]

    return BalancedOnModel


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one flat buffer count once,
    by the buffer's size)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None and t.numel()}


class DeepSpeedEngine:
    """Build and train one rank's part of the model with DeepSpeed (after init_process_group)."""

    name = "deepspeed"

    def __init__(self, spec: ModelSpec, layout: Layout, *, rank: int, world_size: int,
                 device: torch.device, seed: int = 0, data: str | None = None,
                 bucket_bytes: int | None = None, local_rank: int = 0) -> None:
        # DeepSpeed asserts LOCAL_RANK is set and calls set_device(LOCAL_RANK): it must be the
        # device run.py chose (0 for every rank under --gpu-bind=closest), overriding what a
        # launcher set, or local ranks 1-7 ask for a GCD they cannot see.
        os.environ["LOCAL_RANK"] = str(engine_local_rank(
            local_rank, device.index if device.type != "cpu" else None))
        import deepspeed

        # Joins the process group run.py created (gloo on CPU, NCCL on GPUs); the PipelineModule
        # topology needs DeepSpeed's communication backend before deepspeed.initialize.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        self.spec, self.layout, self.device, self.seed = spec, layout, device, seed
        self.rank = rank
        self.coords = coords_of(layout, rank)
        torch.manual_seed(seed + 7919 * self.coords["dp"] + 104729 * self.coords["pp"])
        self.data = TokenSource(spec.vocab, spec.seq_len, seed, data)
        self.meter = SavedTensorMeter()
        self.config = deepspeed_config(
            layout, bucket_mb=bucket_bytes / 2**20 if bucket_bytes else None)
        self.has_first = self.has_last = True
        if layout.pp > 1:
            model = self._pipeline_module(spec, layout, seed, device)
            stage = self.coords["pp"]
            self.has_first, self.has_last = stage == 0, stage == layout.pp - 1
        else:
            model = build_model(spec, seed=seed, dtype=layout.dtype, device=device,
                                flash=layout.flash_attention, recompute=layout.recompute)
        model.train()
        self.inner = None

        def make_optimizer(params):
            self.inner = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
            return self.inner

        # AutoTP replaces the linear layers inside initialize: the optimizer must be built on
        # the sharded parameters, so DeepSpeed gets a callable (machine-notes). Under pipelines
        # the stages hold their slices already (tp_layers.py) and PipelineModule's grid is the
        # mpu (deepspeed.initialize takes no other with a PipelineModule).
        autotp = layout.tp > 1 and layout.pp == 1
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer if autotp
            else make_optimizer(list(model.parameters())), config=self.config)
        self._model_params = list(self.engine.module.parameters())
        self.stage = self.config["zero_optimization"]["stage"]
        self._state: RankState | None = None
        self._grads_peak = 0
        self._wrap_inner_step()
        if layout.pp > 1:
            self._wrap_grad_reduction()

    def _pipeline_module(self, spec: ModelSpec, layout: Layout, seed: int,
                         device: torch.device):
        """``deepspeed.pipe.PipelineModule`` over the pieces, split by parameter count
        (``partition_method='parameters'``, DeepSpeed's default and the cost model's
        ``pipeline_split`` for this engine); only this stage's pieces are built (LayerSpec).

        With tp > 1 each piece holds this TP rank's slices (Megatron-DeepSpeed's layers,
        ``tp_layers.py``), the loss is the vocabulary-parallel cross entropy, and the TP group
        is the (pipe, data)-fixed ``model`` axis of the topology: the grid's slice group, bound
        to the layers once PipelineModule has built it."""
        from deepspeed.pipe import LayerSpec
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        tp = TPGroup(self.coords["tp"], layout.tp) if layout.tp > 1 else None
        kw = dict(seed=seed, dtype=layout.dtype, device=str(device),
                  flash=layout.flash_attention, recompute=layout.recompute, tp=tp)
        specs = [LayerSpec(GPTPiece, spec, ids, first, last, **kw)
                 for ids, first, last in piece_args(spec)]
        topo = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp,
                                             num_dp=layout.dp)
        loss = loss_fn if tp is None else functools.partial(vocab_parallel_loss, tp=tp,
                                                            vocab=spec.vocab)
        # PipelineModule prints its partition on stdout, where flm bench's summary line goes.
        with contextlib.redirect_stdout(sys.stderr):
            module = _balanced_pipeline_module()(
                piece_params(spec), layers=specs, topology=topo, loss_fn=loss,
                partition_method="parameters")
        if tp is not None:
            tp.group = module.mpu().get_slice_parallel_group()
        if spec.tied_embeddings:
            self._tie_embeddings(module, layout)
        return module

    def _tie_embeddings(self, module, layout: Layout) -> None:
        """Tied embeddings across pipeline stages, as Megatron keeps them: the first stage's
        token embedding and the last stage's head are two copies of one matrix (the same init,
        keyed by the embedding's name; under TP the same vocabulary rows), whose gradients are
        summed over a group of the first and last stage of each (dp, tp) position before the
        data-parallel reduction; the updates then agree. DeepSpeed's ``TiedLayerSpec`` would
        build one module type at both ends, which does not fit these pieces (positions on the
        first stage, the final norm on the last), so the pairs are handed to its pipeline engine
        through ``get_tied_weights_and_groups``. Every rank creates every group, in one order
        (new_group is collective)."""
        mine = None
        for d in range(layout.dp):
            for t in range(layout.tp):
                ranks = [axes.rank_of({"pp": p, "dp": d, "tp": t}, layout)
                         for p in (0, layout.pp - 1)]
                group = torch.distributed.new_group(ranks)
                if self.rank in ranks:
                    mine = group
        names = ("gpt.tok_embeddings.weight", "gpt.output.weight")
        for name, p in module.named_parameters():
            if name.endswith(names):
                module.tied_weights.append((p, mine))
                if name.endswith(names[1]):
                    p.ds_pipe_replicated = True  # counted once in DeepSpeed's gradient norm

    # -- measuring what this rank holds -----------------------------------------------------
    def _wrap_inner_step(self) -> None:
        """Measure gradients where they are complete: when DeepSpeed calls the torch optimizer
        (after the reduction, at the accumulation boundary)."""
        inner_step = self.inner.step

        def step(*args, **kwargs):
            out = inner_step(*args, **kwargs)
            if self._state is None:
                self._state = self._measure()
            return out

        self.inner.step = step

    def _wrap_grad_reduction(self) -> None:
        """Under pipelines measure the gradients when the last micro-batch's backward is done
        and before DeepSpeed reduces them (PipelineEngine's ReduceGrads instruction): ZeRO-1
        frees the whole ``.grad`` of a rank's parameters once they are reduced into its
        partition, before the torch optimizer runs."""
        for name in ("allreduce_gradients", "_bf16_reduce_grads"):
            reduce = getattr(self.engine, name)

            def measured(*args, _reduce=reduce, **kwargs):
                self._grads_peak = max(self._grads_peak, _storage_bytes(
                    [p.grad for p in self._model_params]))
                return _reduce(*args, **kwargs)

            setattr(self.engine, name, measured)

    def _param_tensors(self) -> list[torch.Tensor]:
        """The parameter storage this rank keeps between steps (ZeRO-3: its partitions)."""
        if self.stage == 3:
            # ZeRO++ hpZ adds a secondary shard over its partition group (gathered in backward).
            return [t for p in self._model_params
                    for t in (p.ds_tensor, getattr(p, "ds_secondary_tensor", None))
                    if t is not None]
        return [p.detach() for p in self._model_params]

    def _measure(self) -> RankState:
        params = self._param_tensors()
        param_storage = _storages(params)
        opt_params = [p for g in self.inner.param_groups for p in g["params"]]
        # Gradients: the model's .grad (ZeRO 0/1 keep whole ones) and the partitions the
        # torch optimizer was handed (ZeRO 1-3); the same storage counted once.
        accumulator = getattr(self.engine.optimizer, "fp32_groups_gradients_flat", None)
        if accumulator is None:
            grads = [p.grad for p in self._model_params] + [p.grad for p in opt_params]
        else:
            # BF16_Optimizer holds the bf16 .grad beside its whole accumulator in
            # ``grad_acc_dtype`` (deepspeed/runtime/bf16_optimizer.py, DeepSpeed 0.19.8). The
            # partition Adam is handed is a view of it when that is fp32, but a transient fp32
            # copy made in ``step`` (``grad_partition.to(param_partition.dtype)``, dropped right
            # after) when it is bf16: counting that copy would report 4 bytes per parameter over
            # dp in place of the 2-byte accumulator the optimizer keeps all step.
            grads = [p.grad for p in self._model_params] + list(accumulator)
        # Optimizer: Adam's moments, plus DeepSpeed's fp32 master partition where it is a copy
        # (ZeRO 1/2 always clone it, even in fp32; ZeRO-3 shares the fp32 parameters).
        state = [t for s in self.inner.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor) and t.dim() > 0]
        masters = [p for p in opt_params if p.untyped_storage().data_ptr() not in param_storage]
        return RankState(params_bytes=sum(t.numel() * t.element_size() for t in params),
                         grads_bytes=_storage_bytes(grads),
                         optimizer_bytes=_storage_bytes(state) + _storage_bytes(masters))

    def state_bytes(self) -> RankState:
        state = self._state or RankState(0, 0, 0)
        return RankState(state.params_bytes, max(state.grads_bytes, self._grads_peak),
                         state.optimizer_bytes)

    @property
    def activations_peak_bytes(self) -> int:
        return self.meter.peak

    def parameters(self) -> list[nn.Parameter]:
        return list(self._model_params)

    # -- one training step -----------------------------------------------------------------
    def _fwd_bwd(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        lay = self.layout
        if lay.pp > 1:
            # PipelineEngine runs the whole 1F1B schedule over the micro-batches (first stage
            # reads inputs, last stage labels) and returns their mean loss on every rank.
            batches = iter(list(zip(inputs.split(lay.micro_batch),
                                    targets.split(lay.micro_batch), strict=True)))
            loss = self.engine.train_batch(data_iter=batches)
            return float(loss) if self.has_last else None
        total = 0.0
        for x, y in zip(inputs.split(lay.micro_batch), targets.split(lay.micro_batch),
                        strict=True):
            loss = loss_fn(self.engine(x), y)
            # DeepSpeed scales by 1/gradient_accumulation_steps in backward and steps the
            # optimizer at the accumulation boundary only.
            self.engine.backward(loss)
            # ZeRO 0/1 accumulate whole gradients in .grad until the boundary; ZeRO 2 views
            # of its partition buffer: what is held between backward and the step.
            self._grads_peak = max(self._grads_peak, _storage_bytes(
                [p.grad for p in self._model_params]))
            self.engine.step()
            total += float(loss.detach()) / lay.num_microbatches
        return total

    def step(self, step: int, measure_activations: bool = False) -> float | None:
        """One optimizer step over this rank's slice of global batch ``step`` (DeepSpeed steps
        the optimizer inside ``_fwd_bwd``, at the accumulation boundary)."""
        return run_batch(self, step, measure_activations, self._fwd_bwd)
