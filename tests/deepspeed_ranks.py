"""One rank of tests/test_bench_deepspeed.py: trains several layouts in one gloo process group.

Run as ``python tests/deepspeed_ranks.py OUT CASES_JSON`` with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set. Every case builds the real DeepSpeedEngine of ``flm bench
--engine deepspeed`` (deepspeed.initialize, ZeRO, PipelineModule) and trains 5 fp32 steps; the
rank writes OUT/rank<N>.json with each case's losses (last pipeline stage), coordinates and
model-state bytes. One launch for many layouts: the imports and DeepSpeed's op load are paid
once. Teardown as machine-notes: barrier, destroy_process_group, flush, os._exit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main(out: Path, cases: list[dict]) -> int:
    import torch
    import torch.distributed as dist

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
        losses = [engine.step(s) for s in range(case["steps"])]
        state = engine.state_bytes()
        results.append({"id": case["id"], "losses": losses, "coords": engine.coords,
                        "has_last": engine.has_last, "params_bytes": state.params_bytes,
                        "grads_bytes": state.grads_bytes,
                        "optimizer_bytes": state.optimizer_bytes,
                        # PipelineModule's own piece boundaries (pp > 1).
                        "parts": [int(p) for p in getattr(engine.engine.module, "parts", [])]})
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from rank_exit import run_rank  # tests/, this script's folder, is on sys.path

    run_rank(main, Path(sys.argv[1]), json.loads(sys.argv[2]))
