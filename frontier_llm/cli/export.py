"""flm export: a layout as another trainer's flags, TOML or ds_config (docs/export.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from frontier_llm.cli.common import add_command
from frontier_llm.cli.layout_args import add_layout_args
from frontier_llm.cli.moe_args import with_router_balance
from frontier_llm.cli.numbers import count, gpus
from frontier_llm.cli.overlap_args import add_p2p_overlap, add_tp_overlap
from frontier_llm.cli.run_settings import settings_from_args
from frontier_llm.errors import UserError
from frontier_llm.planner.run_settings import RunSettings
from frontier_llm.specs.layout import Layout, given_options
from frontier_llm.specs.model import ModelSpec
from frontier_llm.trainers import NAMES, Trainer, get

TRAINER_CHOICES = NAMES
SKIPPED_SHOWN = 5  # --from-plan: the skipped ranks named one a line, the rest counted


# How --from-plan treats each run setting of the plan (planner/run_settings.py's names):
# written by the export as priced, or refused by unwritten_setting when the export would write
# another run (tests/test_export_from_plan.py holds this to every setting, so a new one is not
# priced in the plan and dropped from the file in silence).
SETTINGS_EXPORTED = {
    "eager": "written: compilation off (torchtitan) where the plan was priced eager",
    "tp_comm_overlap": "written: Megatron-LM's --tp-comm-overlap, refused by other trainers",
    "p2p_overlap": "written: Megatron-LM's --overlap-p2p-communication, refused by others",
    "cp_exchange": "refused unless the trainer's own (torchtitan: ring)",
    "deepspeed_overlap_comm": "refused off where the export writes a ds_config",
    "moe_overlap": "refused unless none for an MoE model",
    "moe_dispatcher": "refused unless alltoall for an MoE model",
}


def unwritten_setting(trainer: Trainer, model: ModelSpec, settings: RunSettings) -> str | None:
    """One line refusing a plan setting the export would not write (the plan would rank a run
    other than the file's), naming what it writes instead; None when the export writes the run
    the plan prices. A setting with no effect on the trainer's layouts (DeepSpeed's
    overlap_comm beside Megatron-LM; the MoE settings of a dense model) passes."""
    from frontier_llm.specs.layout import Engine

    if (trainer.cp_exchange is not None
            and settings.cp_exchange not in (None, trainer.cp_exchange)):
        # The trainer's own context parallelism is what the plan prices (torchtitan:
        # PyTorch's ring); a plan asked for another exchange would rank layouts the trainer
        # does not run.
        return (f"--plan-args '--cp-exchange {settings.cp_exchange}': {trainer.title} runs "
                f"context parallelism as --cp-exchange {trainer.cp_exchange} (PyTorch's "
                "context_parallel ring), so its plan is priced that way; drop the flag, or "
                "plan flm bench's own with flm plan")
    if not settings.deepspeed_overlap_comm and Engine.DEEPSPEED in trainer.engines:
        # trainers/deepspeed_config.py writes zero_optimization.overlap_comm true.
        return (f"--plan-args '--deepspeed-overlap-comm off': the ds_config flm export writes "
                f"for {trainer.title} sets zero_optimization.overlap_comm true, so its plan is "
                "priced with it on; drop the flag")
    if not model.is_moe:
        return None
    if settings.moe_overlap != "none":
        # trainers/megatron_common.py writes no --overlap-moe-expert-parallel-comm, and no
        # trainer flm exports to runs DualPipe (cli/moe_args.py DUALPIPE_NOTE).
        return (f"--plan-args '--moe-overlap {settings.moe_overlap}': flm export writes "
                f"{trainer.title}'s MoE all-to-alls without overlap (--moe-overlap none: no "
                "--overlap-moe-expert-parallel-comm, no DualPipe), so its plan is priced that "
                "way; drop the flag")
    if settings.moe_dispatcher != "alltoall":
        return (f"--plan-args '--moe-dispatcher {settings.moe_dispatcher}': flm export writes "
                f"{trainer.title}'s all-to-all token dispatch (--moe-dispatcher alltoall; "
                "Megatron-LM --moe-token-dispatcher-type alltoall), so its plan is priced that "
                "way; drop the flag")
    return None


def _plan_layout(args: argparse.Namespace, model: ModelSpec, system) -> tuple[Layout, ModelSpec]:
    """Rank ``--rank`` of the ranking ``flm plan`` prints for the same model, system, GPUs and
    ``--plan-args`` (its restrict flags, read by flm plan's own parser with its defaults),
    among the layouts the target trainer runs: planned with its engines unless ``--engine`` is
    among the plan arguments, and a layout the trainer refuses is skipped. The model at the
    plan's ``--seq-len`` comes back with it."""
    import dataclasses

    from frontier_llm.cli import build_parser
    from frontier_llm.cli.layout_args import space_from_args
    from frontier_llm.planner import SearchSpace, plan

    trainer = get(args.to)
    words = ["plan", "--model", args.model, "--system", system.name, "--gpus", str(args.gpus)]
    if args.global_batch is not None:
        words += ["--global-batch", str(args.global_batch)]
    ns = build_parser("plan").parse_args(words + shlex.split(args.plan_args or ""))
    if getattr(ns, "seq_len", None):
        model = dataclasses.replace(model, seq_len=ns.seq_len)
    space = space_from_args(ns)
    if space.get("engine") is None:
        space["engine"] = tuple(e.value for e in trainer.engines)
    # The plan's --router-balance is the model's: priced, and written by the trainer (Megatron
    # -LM's --moe-router-load-balancing-type and friends) or refused in its check.
    model = with_router_balance(model, ns)
    settings = settings_from_args(ns)
    refused = unwritten_setting(trainer, model, settings)
    if refused:
        raise UserError(refused)
    args.plan_eager = settings.eager  # priced eager: the export leaves compilation off
    if trainer.cp_exchange is not None:
        settings = dataclasses.replace(settings, cp_exchange=trainer.cp_exchange)
    # Priced with the plan's own --overlap-p2p-comm and --tp-comm-overlap: the export renders
    # the same run, so a value given beside --plan-args must agree with the plan's.
    args.plan_p2p_overlap = settings.p2p_overlap
    args.plan_tp_overlap = settings.tp_comm_overlap
    for flag, given, priced in (
            ("--overlap-p2p-comm", getattr(args, "overlap_p2p_comm", None), args.plan_p2p_overlap),
            ("--tp-comm-overlap", getattr(args, "tp_comm_overlap", None), args.plan_tp_overlap)):
        if given is not None and (given == "on") != priced:
            raise UserError(f"{flag} {given} but the plan (--plan-args) prices it "
                            f"{'on' if priced else 'off'}: give it in --plan-args, "
                            "where flm plan reads it")
    # Megatron-LM's check depends on them (interleaved pp 2 needs the p2p overlap, the TP
    # overlap needs sequence parallelism); a trainer with no such setting refuses it in
    # export().
    run = trainer.run_settings(args.plan_p2p_overlap, args.plan_tp_overlap)
    result = plan(model, system, ns.gpus, ns.global_batch, SearchSpace(dtype=ns.dtype, **space),
                  **settings.keywords())
    ranked = result.ranked_indices(None, fits_only=not ns.include_oom, frontier=not ns.all)
    from frontier_llm.specs.forms import label

    runnable, skipped = [], []
    for place, index in enumerate(ranked, 1):
        layout = result.layout(int(index))
        try:
            trainer.check(model, layout, **run)
        except UserError as why:
            # Said, not skipped in silence: the plan's #1 may be a layout the trainer cannot
            # express (AMSP partial sharding, say), and the user compares with flm plan.
            skipped.append(f"plan rank {place} ({label(layout)}): {why}")
            continue
        runnable.append(layout)
        if len(runnable) == args.rank:
            for line in skipped[:SKIPPED_SHOWN]:
                print(f"flm export: skipped {line}", file=sys.stderr)
            if len(skipped) > SKIPPED_SHOWN:
                print(f"flm export: ... and {len(skipped) - SKIPPED_SHOWN} more skipped",
                      file=sys.stderr)
            if skipped:
                print(f"flm export: writing plan rank {place} ({label(layout)}), rank "
                      f"{args.rank} among the layouts {trainer.name} runs", file=sys.stderr)
            return layout, model
    raise UserError(f"flm plan ranks {len(ranked)} layouts of {model.name} on {args.gpus} GPUs "
                    f"of {system.name}, {len(runnable)} of them runnable by {trainer.name}; "
                    f"there is no rank {args.rank}")


def _best_layout(path: str) -> tuple[Layout, float | None]:
    """The ``layout`` mapping of the document ``flm tune best`` writes (YAML or JSON), and the
    tuned ``bucket_mb`` among its run settings (``bench_args``), if any."""
    from frontier_llm.specs.yamlio import load_yaml

    doc = load_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("layout"), dict):
        raise UserError(f"{path}: not a 'flm tune best' document (no 'layout' mapping)")
    if not doc["layout"]:
        # An empty layout reads as every default (1 GPU, batch 1, no sharding): what an older
        # flm tune best wrote for a told trial. Never export it as if it were the winner.
        raise UserError(f"{path}: its layout is empty (an older flm tune best's told trial); "
                        "run flm tune best again")
    layout = dict(doc["layout"])
    settings = {**(layout.pop("bench_args", None) or {}), **(doc.get("bench_args") or {})}
    bucket = settings.get("bucket_mb")
    if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, int | float)
                               or bucket <= 0):
        raise UserError(f"{path}: bench_args.bucket_mb must be a positive number of MiB "
                        f"(got {bucket!r})")
    return Layout.from_dict(layout), (float(bucket) if bucket is not None else None)


def run_export(args: argparse.Namespace) -> int:
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.export import export, layout_for

    # With --from-plan, --global-batch is the plan's global batch, not a layout flag.
    flags = {k: v for k, v in given_options(args).items()
             if not (args.from_plan and k == "global_batch")}
    sources = [name for name, given in (("layout flags", bool(flags)),
                                        ("--from-plan", args.from_plan),
                                        ("--from-best", args.from_best is not None)) if given]
    if len(sources) != 1:
        raise UserError("give the layout one way: layout flags (--tp ...), --from-plan --gpus N "
                        "[--rank K] or --from-best FILE" + (f" (got {' and '.join(sources)})"
                                                           if sources else ""))
    if args.gpus is not None and not args.from_plan:
        raise UserError("--gpus is for --from-plan (the plan's GPU count)")
    model = load_model(args.model)
    system = None
    if args.system is not None or args.from_plan:
        from frontier_llm.cli.plan import DEFAULT_SYSTEM

        system = load_system(args.system or DEFAULT_SYSTEM)
    bucket_mb = None
    if args.from_plan:
        if args.gpus is None:
            raise UserError("--from-plan needs --gpus N (the GPU count flm plan ranked for)")
        layout, model = _plan_layout(args, model, system)
    elif args.from_best is not None:
        layout, bucket_mb = _best_layout(args.from_best)
    else:
        layout = layout_for(args.to, {"dtype": "bf16", **flags})  # flm predict's default dtype
    trainer = get(args.to)
    p2p_overlap = (args.plan_p2p_overlap if args.from_plan
                   else getattr(args, "overlap_p2p_comm", None) == "on")
    tp_comm_overlap = (args.plan_tp_overlap if args.from_plan
                       else getattr(args, "tp_comm_overlap", None) == "on")
    text = export(trainer.name, model, layout, system, ds_config_path=args.ds_config,
                  bucket_mb=bucket_mb, compiled=not getattr(args, "plan_eager", False),
                  p2p_overlap=p2p_overlap, tp_comm_overlap=tp_comm_overlap)
    for note in trainer.notes(model, layout, bucket_mb=bucket_mb):
        print(f"flm export: {note}", file=sys.stderr)
    if trainer.argv_names_files and args.ds_config_given:
        # The one file its flags name (Megatron-DeepSpeed's ds_config).
        for text_of_file in trainer.files(model, layout, system, bucket_mb=bucket_mb).values():
            Path(args.ds_config).write_text(text_of_file)
        print(f"flm export: wrote the ds_config the flags name to {args.ds_config}",
              file=sys.stderr)
    elif trainer.argv_names_files:
        print(f"flm export: the flags name {args.ds_config}; --ds-config PATH writes it",
              file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


class _DsConfigPath(argparse.Action):
    """--ds-config PATH: the path the flags name, and written only when given."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.ds_config = values
        namespace.ds_config_given = True


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "export", "write a layout as another trainer's flags, TOML or ds_config",
        "Write one layout for another trainer: Megatron-LM or Megatron-DeepSpeed pretrain_gpt.py "
        "flags (model shape, parallel degrees, batches, schedule, recomputation, sequence "
        "parallelism, distributed optimizer or ZeRO, precision, flash attention), torchtitan's "
        "job-config TOML (FSDP/HSDP degrees, pipeline schedule and split, activation "
        "checkpointing), or DeepSpeed's ds_config.json. The layout comes as flm's layout flags, "
        "as rank K of flm plan's ranking (--from-plan), or as the winner flm tune best wrote "
        "(--from-best). A layout the trainer cannot express is refused in one line that says "
        "why (exit 2). Names and sources: docs/export.md.",
        ["flm export --to megatron-lm --model gpt-175b --tp 8 --pp 16 --dp 8 --global-batch 1024 "
         "--zero 1 --sequence-parallel --recompute selective",
         "flm export --to megatron-deepspeed --model gpt-175b --from-plan --gpus 1024 --rank 1 "
         "--plan-args '--engine megatron --schedule 1f1b' --ds-config ds_config.json",
         "flm export --to torchtitan --model llama3-8b --from-best best.yaml --out job.toml",
         "flm export --to deepspeed --model llama3-8b --dp 8 --zero 3 --out ds_config.json"],
    )
    p.add_argument("--to", required=True, choices=TRAINER_CHOICES,
                   help="the trainer (frontier_llm/trainers/: one module each)")
    p.add_argument("--model", required=True, help="catalog name or YAML path (see flm models)")
    p.add_argument("--system", default=None,
                   help="catalog name or YAML path: named in the output; --from-plan plans for "
                        "it (default frontier there, as flm plan)")
    p.add_argument("--out", metavar="FILE", default=None, help="write here (default stdout)")
    p.add_argument("--ds-config", metavar="PATH", default="ds_config.json",
                   action=_DsConfigPath,
                   help="megatron-deepspeed: the ds_config path its --deepspeed_config flag "
                        "names (default ds_config.json); given, the file is written too")
    p.set_defaults(ds_config_given=False)
    g = p.add_argument_group("from flm plan", "rank K of the ranking flm plan prints for the "
                             "same model, system, GPUs and global batch (planner defaults)")
    g.add_argument("--from-plan", action="store_true", help="take the layout from flm plan")
    g.add_argument("--gpus", type=gpus, default=None, help="the GPU count to plan for")
    g.add_argument("--rank", type=count(1), default=1, help="which rank (default 1, the best)")
    g.add_argument("--plan-args", metavar="'FLAGS'", default=None,
                   help="flm plan's restrict flags, quoted, as you gave them to flm plan "
                        "(e.g. '--engine megatron --schedule 1f1b'); --include-oom and --all "
                        "rank as there")
    p.add_argument("--from-best", metavar="FILE", default=None,
                   help="take the layout from the YAML or JSON flm tune best wrote")
    add_p2p_overlap(p, "; --to megatron-lm, an interleaved layout only (pp 2 interleaved "
                    "needs it on: Megatron asserts pp > 2 without it); with --from-plan give it "
                    "in --plan-args, as flm plan reads it", default=None)
    add_tp_overlap(p, "; --to megatron-lm only, a layout with --sequence-parallel (Megatron "
                   "asserts it); other trainers refuse it; with --from-plan give it in "
                   "--plan-args, as flm plan reads it", default=None)
    add_layout_args(p, required=False)
    # --global-batch is a layout flag; with --from-plan it is the plan's global batch.
    p.set_defaults(func=run_export)
