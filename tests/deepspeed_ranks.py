"""One rank of tests/test_bench_deepspeed.py: trains several layouts in one gloo process group.

Run as ``python tests/deepspeed_ranks.py OUT CASES_JSON`` with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set. Every case builds the real DeepSpeedEngine of ``flm bench
--engine deepspeed`` (deepspeed.initialize, ZeRO, PipelineModule) and trains 5 fp32 steps; the
rank writes OUT/rank<N>.json with each case's losses (last pipeline stage), coordinates,
model-state bytes and, for a case with ``"collectives": true``, the collectives DeepSpeed issued
in its last step: per phase (each micro-batch's ``backward``, then ``step``), the elements each
kind of collective moved. One launch for many layouts: the imports and DeepSpeed's op load are
paid once. Teardown as machine-notes: barrier, destroy_process_group, flush, os._exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce",
               "all_gather", "reduce_scatter")


class CollectiveLog:
    """Counts the elements of every collective issued through ``torch.distributed`` (where
    DeepSpeed's comm backend sends them) under the phase set by the wrapped engine calls."""

    def __init__(self, dist) -> None:
        self.phase: str | None = None
        self.events: dict[str, dict[str, int]] = {}
        for name in COLLECTIVES:
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name, call):
        import torch

        def counted(*args, **kwargs):
            if self.phase is not None:
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                elems = max((t.numel() for t in tensors), default=0)
                per = self.events.setdefault(self.phase, {})
                per[name] = per.get(name, 0) + elems
            return call(*args, **kwargs)
        return counted

    def watch(self, ds_engine) -> None:
        """Tag what ``backward`` and ``step`` issue with the micro-batch they belong to."""
        backward, step = ds_engine.backward, ds_engine.step
        micro = [0]

        def tagged_backward(*args, **kwargs):
            self.phase = f"backward{micro[0]}"
            try:
                return backward(*args, **kwargs)
            finally:
                self.phase = None

        def tagged_step(*args, **kwargs):
            self.phase = f"step{micro[0]}"
            micro[0] += 1
            try:
                return step(*args, **kwargs)
            finally:
                self.phase = None

        ds_engine.backward, ds_engine.step = tagged_backward, tagged_step


@contextlib.contextmanager
def grad_accum_dtype(dtype: str | None):
    """While the engine is built, its ds_config states ``data_types.grad_accum_dtype`` (None:
    flm's config as exported, which leaves it unset)."""
    from frontier_llm.bench import deepspeed_engine

    plain = deepspeed_engine.deepspeed_config
    if dtype is not None:
        deepspeed_engine.deepspeed_config = lambda *a, **k: {
            **plain(*a, **k), "data_types": {"grad_accum_dtype": dtype}}
    try:
        yield
    finally:
        deepspeed_engine.deepspeed_config = plain


def watch_bf16_optimizer(ds_engine, held: dict[str, int]) -> None:
    """Record in ``held`` the bytes of every tensor DeepSpeed's BF16_Optimizer keeps when the
    last micro-batch's backward is done and its reduction starts (PipelineEngine's ReduceGrads:
    ``_bf16_reduce_grads``), when all of them are alive at once after a first step: the flat
    bf16 parameters, their ``.grad``, the whole gradient accumulator, the fp32 master partition
    and the wrapped optimizer's state (Adam's moments). Each storage counted once."""
    import torch

    opt = ds_engine.optimizer
    reduce = ds_engine._bf16_reduce_grads

    def nbytes(tensors) -> int:
        seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if isinstance(t, torch.Tensor) and t.numel()}
        return sum(seen.values())

    def measured(*args, **kwargs):
        held.update(
            lp_params=nbytes(opt.bf16_groups_flat),
            lp_grads=nbytes(p.grad for g in opt.bf16_groups for p in g),
            accumulator=nbytes(opt.fp32_groups_gradients_flat),
            accumulator_itemsize=opt.fp32_groups_gradients_flat[0].element_size(),
            master=nbytes(opt.fp32_groups_flat_partition),
            moments=nbytes(t for s in opt.optimizer.state.values() for t in s.values()
                           if isinstance(t, torch.Tensor) and t.dim() > 0))
        return reduce(*args, **kwargs)

    ds_engine._bf16_reduce_grads = measured


def main(out: Path, cases: list[dict]) -> int:
    import torch
    import torch.distributed as dist

    log = CollectiveLog(dist)  # before DeepSpeed binds anything

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['MASTER_PORT']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    from frontier_llm.bench.deepspeed_engine import DeepSpeedEngine
    from frontier_llm.catalog import load_model
    from frontier_llm.specs.layout import Layout

    results = []
    for case in cases:
        # "model_fields": ModelSpec fields changed for the case (tied embeddings).
        spec = dataclasses.replace(load_model(case["model"]), **case.get("model_fields", {}))
        # "dtype": the case's training dtype (fp32 unless it says; bf16 for BF16_Optimizer).
        layout = Layout.from_dict({**case["layout"], "engine": "deepspeed",
                                   "dtype": case.get("dtype", "fp32")})
        with grad_accum_dtype(case.get("grad_accum_dtype")):
            engine = DeepSpeedEngine(spec, layout, rank=rank, world_size=world,
                                     device=torch.device("cpu"), seed=0)
        losses = [engine.step(s) for s in range(case["steps"] - 1)]
        held: dict[str, int] = {}
        if case.get("bf16_optimizer"):
            watch_bf16_optimizer(engine.engine, held)
        if case.get("collectives"):
            log.events = {}
            log.watch(engine.engine)
        losses.append(engine.step(case["steps"] - 1))
        state = engine.state_bytes()
        results.append({"id": case["id"], "losses": losses, "coords": engine.coords,
                        "has_last": engine.has_last, "params_bytes": state.params_bytes,
                        "grads_bytes": state.grads_bytes,
                        "optimizer_bytes": state.optimizer_bytes,
                        # The optimizer DeepSpeed chose (BF16_Optimizer, DeepSpeedZeroOptimizer).
                        "optimizer": type(engine.engine.optimizer).__name__,
                        # PipelineModule's own piece boundaries (pp > 1).
                        "parts": [int(p) for p in getattr(engine.engine.module, "parts", [])],
                        "collectives": log.events if case.get("collectives") else None,
                        "bf16_optimizer": held,
                        "param_elements": sum(p.numel() for p in engine.parameters())})
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from rank_exit import run_rank  # tests/, this script's folder, is on sys.path

    run_rank(main, Path(sys.argv[1]), json.loads(sys.argv[2]))
