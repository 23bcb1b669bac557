"""The one place ``flm bench`` picks its training engine from the layout's ``engine`` field.

``check`` refuses, before any process or process group exists, what the layout's engine cannot
run (the rules of ``specs/engine_rules.py`` plus what ``flm bench``'s implementation of that
engine lacks); ``create`` builds the engine on one rank. Everything else (timing, trace, status,
out-of-memory handling) is ``bench/run.py``'s, the same for every engine.
"""

from __future__ import annotations

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec

BENCH_ENGINES = (Engine.NATIVE, Engine.DEEPSPEED)


def check(model: ModelSpec, layout: Layout, world_size: int | None = None) -> None:
    """Raise (UserError / SpecError, exit 2) for a layout this engine's flm bench refuses."""
    if layout.engine == Engine.NATIVE:
        from frontier_llm.bench.mesh import check_layout

        check_layout(model, layout, world_size)
        return
    if layout.engine != Engine.DEEPSPEED:
        raise UserError(f"flm bench runs the engines {', '.join(BENCH_ENGINES)}; "
                        f"engine {layout.engine} is for planning only")
    if model.is_moe:
        # DeepSpeed's own MoE layer (deepspeed.moe.layer.MoE, with its expert-parallel groups)
        # is not wired into flm bench's DeepSpeed engine; its dense path would run every expert
        # on every rank and ignore ep.
        raise UserError(f"{model.name} is a Mixture-of-Experts model: flm bench runs MoE on "
                        "engine native only (DeepSpeed-MoE is not wired in)")
    from frontier_llm.bench.deepspeed_config import zero_settings

    layout.check_model(model)  # the engine's rules (engine_rules.py) included
    if world_size is not None:
        layout.check_world(world_size)
    zero_settings(layout)  # shardings without a DeepSpeed equivalent


def create(cfg, renv, device):
    """This rank's engine for ``cfg`` (a BenchConfig) under launcher ``renv`` (a RankEnv)."""
    kwargs = dict(rank=renv.rank, world_size=renv.world_size, device=device, seed=cfg.seed,
                  data=cfg.data,
                  bucket_bytes=int(cfg.bucket_mb * 2**20) if cfg.bucket_mb else None)
    if cfg.layout.engine == Engine.DEEPSPEED:
        from frontier_llm.bench.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(cfg.model, cfg.layout, local_rank=renv.local_rank, **kwargs)
    from frontier_llm.bench.engine import NativeEngine

    return NativeEngine(cfg.model, cfg.layout, **kwargs,
                        grad_sync_each_microbatch=cfg.grad_sync_each_microbatch)
