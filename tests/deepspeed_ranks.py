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
        layout = Layout.from_dict({**case["layout"], "engine": "deepspeed", "dtype": "fp32"})
        engine = DeepSpeedEngine(spec, layout, rank=rank, world_size=world,
                                 device=torch.device("cpu"), seed=0)
        losses = [engine.step(s) for s in range(case["steps"] - 1)]
        if case.get("collectives"):
            log.events = {}
            log.watch(engine.engine)
        losses.append(engine.step(case["steps"] - 1))
        state = engine.state_bytes()
        results.append({"id": case["id"], "losses": losses, "coords": engine.coords,
                        "has_last": engine.has_last, "params_bytes": state.params_bytes,
                        "grads_bytes": state.grads_bytes,
                        "optimizer_bytes": state.optimizer_bytes,
                        # PipelineModule's own piece boundaries (pp > 1).
                        "parts": [int(p) for p in getattr(engine.engine.module, "parts", [])],
                        "collectives": log.events if case.get("collectives") else None,
                        "param_elements": sum(p.numel() for p in engine.parameters())})
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from rank_exit import run_rank  # tests/, this script's folder, is on sys.path

    run_rank(main, Path(sys.argv[1]), json.loads(sys.argv[2]))
