"""One rank's training step at full size, measured by PyTorch's own memory tracker, no GPU.

``flm memcheck`` builds :class:`~frontier_llm.bench.engine.NativeEngine` for one rank of the
layout (its tp / cp / pipeline-stage / FSDP2 shards, its recompute, micro-batch and loss) at the
real model's shapes, under PyTorch's ``FakeTensorMode`` (tensors with shapes, dtypes and
storage sizes, no data) and a fake process group of the full world size (PyTorch's ``fake``
backend: every collective returns at once). It runs one optimizer step, every micro-batch,
under :class:`torch.distributed._tools.mem_tracker.MemTracker` (``FSDPMemTracker`` when FSDP2
shards the stage), which sees every storage the step creates and frees at the dispatcher, as
the caching allocator would be asked for it, and records the peak and the breakdown at the
peak. torchtitan estimates memory the same way (``scripts/estimate/estimation.py``).

What it is: the bytes the allocator is asked for (``torch.cuda.max_memory_allocated``), not
what it reserves (block rounding and fragmentation, the reserve's job) and not the CUDA/HIP
context or the communication library's own buffers. What it cannot trace: engines whose step is
not flm bench's native one (DeepSpeed's engine, Megatron-LM): those are refused by name.

With ``device="cuda"`` the same step runs for real on one GPU with a fake process group (the
rank's shards at full size: it must fit) and reads ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from frontier_llm.bench.engine import NativeEngine
from frontier_llm.bench.mesh import check_layout
from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Engine, Layout, Schedule
from frontier_llm.specs.model import ModelSpec

# MemTracker's categories (torch/distributed/_tools/mem_tracker.py, fsdp2_mem_tracker.py) ->
# the cost model's terms (costmodel/memory.py). Optimizer states are created before the
# tracker enters (LocalAdam is not a torch.optim optimizer): their storages are added to the
# peak, which they are part of wherever it falls.
CATEGORY_TERMS = {
    "Parameter": "params", "Sharded Param": "params", "Buffer": "params",
    "Gradient": "grads", "Sharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations",
    "Temp": "temporaries",
    "Unsharded Param": "buffers", "Unsharded Grad": "buffers",
    "All Gather": "buffers", "Reduce Scatter": "buffers",
}
TERMS = ("params", "grads", "optimizer", "activations", "temporaries", "buffers")
# The optimizer step's: what it creates (fp32 copies of 16-bit gradients, Adam's denominators,
# ZeRO-1's flat buffers) is its ``temporaries``; the gradients are registered with
# ``track_external`` and filed under ``Other``.
STEP_TERMS = {"Parameter": "params", "Buffer": "params", "Other": "grads",
              "Activation": "temporaries", "Temp": "temporaries", "Optstate": "temporaries"}


@dataclass
class Measurement:
    """One rank's measured step: the peak of its forward and backward (``backward``: bytes by
    term at that peak) and of its gradient reduction and optimizer step (``step``), the larger
    being the step's ``peak_bytes``; the rank measured and its pipeline stage."""

    peak_bytes: int
    backward: dict[str, int]
    step: dict[str, int]
    rank: int
    pp_rank: int
    device: str = "fake"
    reserved_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def phase(self) -> str:
        """Where the peak falls: ``backward`` or ``step``."""
        return "step" if sum(self.step.values()) > sum(self.backward.values()) else "backward"


def _fold(snapshot: dict[str, int], terms: dict[str, str] = CATEGORY_TERMS
          ) -> dict[str, int]:
    out = dict.fromkeys(dict.fromkeys(terms.values()), 0)
    for name, value in snapshot.items():
        term = terms.get(str(getattr(name, "value", name)))
        if term is not None:
            out[term] += int(value)
    return out


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """A fake process group of ``world_size`` ranks, this process being ``rank``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UserError("flm memcheck needs a process with no process group")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _real_meshes() -> Iterator[None]:
    """Device meshes built from real tensors inside fake mode: a mesh reads its rank layout
    back (``tolist``), which a fake tensor has no data for."""
    import torch.distributed.device_mesh as dm
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original, build = dm.DeviceMesh.__init__, dm.init_device_mesh
    # The expert-dp mesh of FSDP2 with ep > 1 is cut out of the world mesh (bench/engine.py
    # ``_expert_mesh``), which reads the layout back the same way.
    unflatten = getattr(dm.DeviceMesh, "_unflatten", None)

    def init(self, *args, **kwargs):
        with unset_fake_temporarily():
            original(self, *args, **kwargs)

    def init_device_mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return build(*args, **kwargs)

    def real_unflatten(self, *args, **kwargs):
        with unset_fake_temporarily():
            return unflatten(self, *args, **kwargs)

    dm.DeviceMesh.__init__, dm.init_device_mesh = init, init_device_mesh
    if unflatten is not None:
        dm.DeviceMesh._unflatten = real_unflatten
    try:
        yield
    finally:
        dm.DeviceMesh.__init__, dm.init_device_mesh = original, build
        if unflatten is not None:
            dm.DeviceMesh._unflatten = unflatten


@contextlib.contextmanager
def _untracked_propagation(tracker) -> Iterator[None]:
    """DTensor's shape propagation unseen by ``tracker``. To learn an output's metadata DTensor
    runs each op once on the *global* shapes (torch/distributed/tensor/_sharding_prop.py
    ``_propagate_tensor_meta_non_cached``, in ``detect_fake_mode() or FakeTensorMode()``), and
    so do loss parallelism's cross-entropy handlers (torch/distributed/tensor/parallel/loss.py
    ``_propagate_tensor_meta``). On a GPU that is a fake mode of its own, which MemTracker skips;
    inside flm memcheck's fake mode it *is* the step's mode, and the tracker would count
    global-shape tensors no rank holds (measured on the vocabulary-parallel loss: with real
    tensors 1 fp32 log-probability shard saved and 3 in backward; under fake mode without this,
    up to 2·tp)."""
    from torch.distributed.tensor import _sharding_prop
    from torch.distributed.tensor.parallel import loss

    def quiet(original):
        def call(*args, **kwargs):
            seen = tracker._fake_mode_on_entry
            tracker._fake_mode_on_entry = object()  # no mode is this one: nothing is tracked
            try:
                return original(*args, **kwargs)
            finally:
                tracker._fake_mode_on_entry = seen
        return call

    prop = _sharding_prop.ShardingPropagator
    originals = (loss._propagate_tensor_meta, prop._propagate_tensor_meta_non_cached)
    loss._propagate_tensor_meta = quiet(originals[0])
    prop._propagate_tensor_meta_non_cached = quiet(originals[1])
    try:
        yield
    finally:
        loss._propagate_tensor_meta, prop._propagate_tensor_meta_non_cached = originals


def _balanced_forward(self, x: torch.Tensor) -> torch.Tensor:
    """An MoE block's forward (bench/moe.py ``MoE.forward``) with every expert receiving the
    mean number of assignments, ``tokens·top_k / experts``: a fake tensor has no router output
    to count, and the balanced load is the one the cost model prices for memory. The router,
    its top-k and renormalised weights, the gather of token rows, the all-to-all exchanges
    over the ep group, every local expert's MLP, the weighted scatter back and the shared
    experts run as in flm bench; the router's auxiliary loss (a scalar) does not."""
    from torch.nn import functional as F

    from frontier_llm.bench.moe import _Exchange

    spec, shape = self.spec, x.shape
    tokens = x.reshape(-1, shape[-1])
    probs = self.router(tokens).float().softmax(dim=-1)
    top_p, _ = probs.topk(spec.top_k, dim=-1)
    weights = top_p / top_p.sum(-1, keepdim=True)
    n, experts = tokens.shape[0] * spec.top_k, spec.num_experts
    # Assignment j (slot-major, as ``route``) goes to expert j mod E, sorted by expert.
    order = torch.argsort(torch.arange(n) % experts, stable=True)
    token = (torch.arange(n) % tokens.shape[0])[order]
    weight = weights.t().reshape(-1)[order]
    rows = tokens[token]
    ep = 1 if self.ep is None else self.ep.ep
    local = experts // ep
    if self.ep is None:
        y = _run_balanced(self, rows, ep, local, n // experts)
    else:
        split = [local * (n // experts)] * ep
        moved = _Exchange.apply(rows, split, split, self.ep.group, self.stats, "dispatch")
        y = _Exchange.apply(_run_balanced(self, moved, ep, local, n // experts), split, split,
                            self.ep.group, self.stats, "combine")
    out = torch.zeros_like(tokens).index_add(0, token, y * weight.to(y.dtype)[:, None])
    for mlp in self.shared.values():
        out = out + mlp(tokens)
    return F.dropout(out.view(shape), p=self.dropout, training=self.training)


def _run_balanced(self, rows: torch.Tensor, sources: int, local: int, each: int
                  ) -> torch.Tensor:
    """``MoE._run_local`` with ``each`` rows from every source for every local expert (the
    sizes known numbers, which ``_run_local`` reads from a tensor)."""
    chunks = list(rows.split([each] * (sources * local)))
    for j, e in enumerate(self.local_experts):
        mine = list(range(j, len(chunks), local))
        y = self.experts[str(e)](torch.cat([chunks[i] for i in mine]))
        for i, part in zip(mine, y.split([each] * len(mine)), strict=True):
            chunks[i] = part
    return torch.cat(chunks)


@contextlib.contextmanager
def _balanced_experts() -> Iterator[None]:
    """flm bench's MoE blocks routed by :func:`_balanced_forward` for the measurement."""
    from frontier_llm.bench.moe import MoE

    original = MoE.forward
    MoE.forward = _balanced_forward
    try:
        yield
    finally:
        MoE.forward = original


@contextlib.contextmanager
def _gpu_attention_kernel() -> Iterator[None]:
    """``F.scaled_dot_product_attention`` with dropout measured as a GPU runs it: a fused kernel.

    PyTorch picks SDPA's backend per device. On CPU the fused (flash) kernel refuses dropout
    (``use_flash_attention_cpp`` lists ``check_for_dropout``: aten/src/ATen/native/transformers/
    sdp_utils_cpp.cpp at 02315a4), so a model with attention dropout (GPT's 0.1) falls back to
    the math path, which materialises the fp32 ``s x s`` scores, softmax, dropout mask and
    dropped probabilities per head (1 GiB each for gpt-22b's 32 heads of a tp-2 rank at
    micro-batch 2). On a CUDA GPU the flash kernel takes dropout (``can_use_flash_attention``
    has no dropout check: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp at 001f694) and
    saves only its output and per-row log-sum-exp. flm memcheck stands for the GPU, so under
    its fake tensors the call goes to the fused CPU kernel's operator, whose shape rules (and
    autograd formula) take any ``dropout_p``: what it allocates is the fused kernel's. Calls
    without dropout, or with grouped K/V heads, are left to SDPA's own choice."""
    from torch.nn import functional as F

    original = F.scaled_dot_product_attention
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        if dropout_p > 0 and q.shape[1] == k.shape[1]:
            return fused(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def peak_rank(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """(global rank, pipeline rank) of the rank the cost model predicts fullest: the first
    rank of that pipeline stage (every tp / dp / cp rank of a stage holds the same). The
    system does not move which stage is fullest (only the fixed reserve is the system's)."""
    from frontier_llm.bench.mesh import mesh_dims
    from frontier_llm.catalog import load_system
    from frontier_llm.costmodel import predict

    stage = int(predict(model, load_system("cpu-local"), layout)["breakdown"]
                ["peak_memory_stage"])
    return mesh_dims(layout).rank_of(stage, 0, 0, 0, 0), stage


def _forward_backward(eng: NativeEngine, tracker, inputs: torch.Tensor,
                      targets: torch.Tensor) -> None:
    """Forward and backward of every micro-batch, as ``NativeEngine`` runs them, without
    reading a loss value (fake tensors have none)."""
    lay = eng.layout
    n = lay.num_microbatches
    parallel = contextlib.nullcontext()
    if lay.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        parallel = loss_parallel()
    with parallel:
        if eng.schedule is not None:
            _pipeline_step(eng, tracker, inputs, targets)
            return
        model = eng.modules[0]
        fsdp = hasattr(model, "set_requires_gradient_sync")
        for i, (x, y) in enumerate(zip(inputs.split(lay.micro_batch),
                                       targets.split(lay.micro_batch), strict=True)):
            if tracker is not None:
                tracker.reset_mod_stats()  # one root call per micro-batch
            if fsdp:
                model.set_requires_gradient_sync(eng.grad_sync_each_microbatch or i == n - 1)
            loss = eng.loss_fn(model(x), y) / n
            loss.backward()
            del loss


def _peak(tracker) -> dict:
    """The tracker's breakdown at its peak (one device: the fake CPU)."""
    snap = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
    return {k: v for k, v in snap.items() if str(getattr(k, "value", k)) != "Total"}


def _optimizer_step(eng: NativeEngine) -> None:
    """The gradients reduced where they belong, the optimizer step, the gradients freed."""
    eng.reduce_gradients()
    eng.optimizer.step()
    eng.optimizer.zero_grad()


def _pipeline_order(schedule: str, m: int, p: int, r: int) -> list[tuple[str, int]]:
    """The forwards (``F``) and backwards (``B``) stage ``r`` of ``p`` runs over ``m``
    micro-batches: GPipe all forwards then all backwards; 1F1B (torch's ``Schedule1F1B``)
    ``p - r - 1`` warm-up forwards, then one forward and one backward in turn, then the
    remaining backwards."""
    if schedule == Schedule.GPIPE:
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(m, p - r - 1)
    order = [("F", i) for i in range(warm)]
    for i in range(warm, m):
        order += [("F", i), ("B", i - warm)]
    return order + [("B", i) for i in range(m - warm, m)]


def _pipeline_step(eng: NativeEngine, tracker, inputs: torch.Tensor,
                   targets: torch.Tensor) -> None:
    """One stage's share of a pipelined step, run in its schedule's order: the fake process
    group carries no activations between stages, so each stage's input is a new tensor of the
    shape the previous stage sends (what the receive buffer holds) and each backward starts
    from a gradient of the shape the next stage sends back."""
    lay = eng.layout
    m, p, r = lay.num_microbatches, lay.pp, eng.coords["pp"]
    model = eng.modules[0]
    io_in, io_out = eng.stage_shapes[0]
    xs = inputs.split(lay.micro_batch)
    ys = targets.split(lay.micro_batch)
    outputs: dict[int, torch.Tensor] = {}
    for kind, i in _pipeline_order(lay.schedule, m, p, r):
        if kind == "F":
            if tracker is not None:
                tracker.reset_mod_stats()
            x = (xs[i] if eng.has_first
                 else torch.zeros(io_in.shape, dtype=io_in.dtype, requires_grad=True))
            out = model(x)
            outputs[i] = eng.loss_fn(out, ys[i]) / m if eng.has_last else out
            del out, x
        else:
            out = outputs.pop(i)
            if hasattr(model, "set_requires_gradient_sync"):
                # As torch's PipelineStage runs an FSDP2 stage (pipelining/stage.py
                # ``backward_maybe_with_nosync``): no reduction and no resharding until the
                # last backward, whose hooks then reduce (``perform_reduce_grad``).
                last = not outputs and i == m - 1
                model.set_is_last_backward(last)
                model.set_reshard_after_backward(last)
                model.set_requires_gradient_sync(last)
            if eng.has_last:
                out.backward()
            else:
                out.backward(torch.ones(io_out.shape, dtype=io_out.dtype))
            del out


def _batch(model: ModelSpec, layout: Layout, device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's token ids and targets: its dp share of the global batch, its cp share of
    each sequence (shapes only matter)."""
    rows = layout.global_batch // layout.dp
    seq = model.seq_len // layout.cp
    ids = torch.zeros(rows, seq, dtype=torch.long, device=device)
    return ids, ids.clone()


def measure(model: ModelSpec, layout: Layout, rank: int | None = None,
            device: str = "fake", grad_sync_each_microbatch: bool = False) -> Measurement:
    """One training step of ``rank`` (default: the rank the cost model predicts fullest) of
    ``layout``, measured (module docstring). ``grad_sync_each_microbatch``: FSDP2 reduces
    after every micro-batch (torchtitan's accumulation) instead of only the last."""
    if layout.engine != Engine.NATIVE:
        raise UserError(
            f"flm memcheck traces flm bench's native engine only: engine {layout.engine} runs "
            "its own step (DeepSpeed's engine allocates its flat buffers inside its own C++ "
            "and Python code; Megatron-LM is not in this process), which this measurement "
            "cannot see: compare its terms with flm predict")
    check_layout(model, layout)
    if layout.pp > 1 and layout.schedule == Schedule.INTERLEAVED:
        # A rank runs several chunks in an order of torch's own (ScheduleInterleaved1F1B);
        # the stage-order replay below knows GPipe's and 1F1B's only.
        raise UserError("flm memcheck replays GPipe and 1F1B pipeline stages; the interleaved "
                        "schedule is not traced yet (compare with flm predict)")
    world = int(layout.world_size)
    if rank is None:
        rank = peak_rank(model, layout)[0]
    if not 0 <= rank < world:
        raise UserError(f"rank {rank} is outside the layout's {world} ranks")
    if device == "cuda":
        return _measure_cuda(model, layout, rank, grad_sync_each_microbatch)
    if device != "fake":
        raise UserError(f"device must be fake or cuda (got {device!r})")
    with warnings.catch_warnings():
        # FSDP2's view-output and FakeTensor's data-pointer notices concern real runs' in-place
        # ops and pointers; the measurement reads neither.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        return _measure_fake(model, layout, rank, world, grad_sync_each_microbatch)


def _measure_fake(model: ModelSpec, layout: Layout, rank: int, world: int,
                  grad_sync_each_microbatch: bool = False) -> Measurement:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    with (fake_world(rank, world), _real_meshes(), _balanced_experts(), _gpu_attention_kernel(),
          FakeTensorMode(allow_non_fake_inputs=True)):
        eng = NativeEngine(model, layout, rank=rank, world_size=world,
                           device=torch.device("cpu"),
                           grad_sync_each_microbatch=grad_sync_each_microbatch)
        fsdp = eng.dims.data_parallel in ("fsdp", "hsdp") and eng.dims.shard_ranks > 1
        tracker = (FSDPMemTracker(eng.modules[0], None) if fsdp and len(eng.modules) == 1
                   else MemTracker())
        for m in eng.modules:
            tracker.track_external(m)
        inputs, targets = _batch(model, layout, torch.device("cpu"))
        with tracker, _untracked_propagation(tracker):
            _forward_backward(eng, tracker, inputs, targets)
        # Held from before the step to after it: at both peaks.
        optimizer = eng.optimizer.state_bytes()
        backward = _fold(_peak(tracker))
        backward["optimizer"] += optimizer
        stepper = MemTracker()
        for m in eng.modules:
            stepper.track_external(m)
        stepper.track_external(*[p.grad for p in eng.parameters() if p.grad is not None])
        with stepper, _untracked_propagation(stepper):
            _optimizer_step(eng)
        step = _fold(_peak(stepper), STEP_TERMS)
        step["optimizer"] = optimizer
        return Measurement(peak_bytes=max(sum(backward.values()), sum(step.values())),
                       backward=backward, step=step, rank=rank, pp_rank=eng.coords["pp"])


def _measure_cuda(model: ModelSpec, layout: Layout, rank: int,
                  grad_sync_each_microbatch: bool = False) -> Measurement:
    """The same step on a real GPU (the rank's shards must fit): the allocator's own peaks."""
    if not torch.cuda.is_available():
        raise UserError("--device cuda: no GPU is visible to this process")
    dev = torch.device("cuda", torch.cuda.current_device())
    with fake_world(rank, int(layout.world_size)):
        eng = NativeEngine(model, layout, rank=rank, world_size=int(layout.world_size),
                           device=dev, grad_sync_each_microbatch=grad_sync_each_microbatch)
        inputs, targets = _batch(model, layout, dev)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        _forward_backward(eng, None, inputs, targets)
        _optimizer_step(eng)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(dev)
        reserved = torch.cuda.max_memory_reserved(dev)
    return Measurement(peak_bytes=int(peak), backward={}, step={}, rank=rank,
                       pp_rank=eng.coords["pp"], device="cuda", reserved_bytes=int(reserved),
                       notes=["the allocator's own peaks; no breakdown on a GPU"])
