"""Export a layout, write the log the trainer prints for it, read it back: the same layout.

Every trainer x every layout axis and setting (issue 49). Each trainer's vocabulary (its flag,
key or mesh name for each setting) is written once in ``frontier_llm/trainers/`` and used by its
exporter and its log reader alike; this test holds the two sides to each other through what the
trainer itself does between them. The log writers below are this test's own, each from the
trainer's code at the commit its exporter cites, and none uses flm's vocabulary tables:

* Megatron-LM (core_v0.15.3, 309ffca) and Megatron-DeepSpeed: argparse stores each flag under
  its dest (``--tensor-model-parallel-size`` -> ``tensor_model_parallel_size``); validate_args
  computes ``data_parallel_size`` = world / (tp x pp x cp) and ``virtual_pipeline_model_
  parallel_size`` (= --num-virtual-stages-per-pipeline-rank, None for 1); ``_print_args``
  prints every argument as ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)`` between
  ``---- arguments ----`` lines (megatron/training/arguments.py); training_log prints
  `` iteration {:8d}/{:8d} | ... elapsed time per iteration (ms): {:.1f} | ... global batch
  size: {:5d} | lm loss: ...`` (megatron/training/training.py).
* torchtitan v0.2.2 (73a0e69): the TOML's keys become ``ParallelDims`` (train.py; unset keys at
  job_config.py's defaults, dp_shard -1 = the rest of the world), whose ``build_mesh`` logs
  ``Building device mesh with parallelism: pp=.., dp_replicate=.., dp_shard=.., cp=.., tp=..,
  ep=.., etp=..``; llama3/infra/parallelize.py logs ``Applied HSDP|FSDP to the model`` when
  dp_shard x cp > 1 (HSDP with replicas), else ``Applied DDP`` for replicas;
  distributed/activation_checkpoint.py logs ``Applied {mode} activation checkpointing to the
  model`` unless mode is none; ``--job.print_config`` prints the config as JSON.
* DeepSpeed: its own ``DeepSpeedConfig`` reads the exported ds_config and its own ``print``
  writes the engine's configuration block (real DeepSpeed, on CPU; its process-group queries
  answered for the layout's world, as a launched rank's would be).

A field the trainer's log does not always state is in its reader's ``unstated``: absent (given
with --layout, never guessed) or as exported; every other field must come back as exported. A
layout a trainer cannot run is refused by the export with the trainer's own reason (named
here).
"""

from __future__ import annotations

import io
import json
import logging
import tomllib

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.export import export, layout_for
from frontier_llm.logs.traces import parse_log
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.sharding import Sharding
from frontier_llm.trainers import NAMES, get
from frontier_llm.trainers.refusals import ExportRefused

BASE = {"dtype": "bf16", "tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "global_batch": 8}
# Every layout axis and setting a trainer's vocabulary names, each varied from BASE.
AXES = {
    "tp": {"tp": 2},
    "cp": {"cp": 2},
    "pp": {"pp": 2},
    "dp": {"dp": 4, "global_batch": 16},
    "ep": {"ep": 2},
    # Expert tensor parallelism below tp (issue 53): with ep 2 the fold Megatron-LM and
    # torchtitan run; with ep 1, one torchtitan has no meaning for (its experts follow tp).
    "etp": {"tp": 2, "ep": 2, "etp": 1, "sequence_parallel": True},
    "etp-ep1": {"tp": 2, "etp": 1},
    "virtual_stages": {"pp": 2, "virtual_stages": 2},
    # Megatron-LM runs interleaving over 2 stages only with its p2p overlap, which flm's
    # export turns off by default (validate_args: pp > 2 without it): 4 stages of llama3-8b.
    "virtual_stages-pp4": {"pp": 4, "virtual_stages": 2},
    "sequence_parallel": {"tp": 2, "sequence_parallel": True},
    "recompute-full": {"recompute": "full"},
    "recompute-selective": {"recompute": "selective"},
    "recompute-selective-op": {"recompute": "selective-op"},
    "micro_batch": {"micro_batch": 2},
    "global_batch": {"global_batch": 32},
    "sharding-zero0": {"zero": 0},
    "sharding-zero1": {"zero": 1},
    "sharding-zero2": {"zero": 2},
    "sharding-zero3": {"zero": 3},
    "sharding-hsdp": {"dp": 4, "global_batch": 16,
                      "sharding": "p=partial:2,g=partial:2,o=partial:2"},
    # Given end stages (Megatron-LM --decoder-first/last-pipeline-num-layers): tiny-llama's 4
    # layers as 3 + 1.
    "stage_layers": {"pp": 2, "first_stage_layers": 3, "last_stage_layers": 1},
}
FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "virtual_stages", "micro_batch", "global_batch",
          "sequence_parallel", "recompute", "sharding", "first_stage_layers", "last_stage_layers")
# What each trainer refuses among the axes, with the words of its reason: the export's refusal
# is the trainer's own (trainers/*.py check), so the pair is both sides refusing alike.
REFUSED = {
    ("megatron-lm", "sharding-zero2"): "Megatron-FSDP", ("megatron-lm", "sharding-zero3"):
    "Megatron-FSDP", ("megatron-lm", "sharding-hsdp"): "Megatron-FSDP",
    ("megatron-lm", "recompute-selective-op"): "selective-op",
    ("megatron-deepspeed", "ep"): "Mixture-of-Experts",
    ("megatron-deepspeed", "etp"): "Mixture-of-Experts",
    ("megatron-deepspeed", "etp-ep1"): "Mixture-of-Experts",
    ("megatron-lm", "etp-ep1"): "needs sequence parallelism",
    ("torchtitan", "etp-ep1"): "no effect",
    ("deepspeed", "etp"): "ep_size argument",
    ("deepspeed", "etp-ep1"): "expert tensor parallelism",
    ("megatron-deepspeed", "virtual_stages"): "1F1B only",
    ("megatron-deepspeed", "virtual_stages-pp4"): "1F1B only",
    ("megatron-lm", "virtual_stages"): "greater than 2",
    ("megatron-deepspeed", "cp"): "context",
    ("megatron-deepspeed", "sharding-hsdp"): "MiCS",
    ("megatron-deepspeed", "recompute-selective-op"): "selective-op",
    ("torchtitan", "tp"): "sequence parallelism is implied",
    ("torchtitan", "recompute-selective"): "no attention-core recomputation",
    ("torchtitan", "sharding-zero1"): "shards the three together",
    ("torchtitan", "sharding-zero2"): "shards the three together",
    ("deepspeed", "cp"): "context", ("deepspeed", "ep"): "ep_size argument",
    ("deepspeed", "virtual_stages"): "interleav",
    ("deepspeed", "virtual_stages-pp4"): "interleav",
    ("deepspeed", "sequence_parallel"): "sequence parallel",
    ("deepspeed", "sharding-hsdp"): "MiCS",
    ("deepspeed", "recompute-selective-op"): "selective-op",
    ("megatron-deepspeed", "stage_layers"): "no per-stage layer counts",
    ("deepspeed", "stage_layers"): "no per-stage layer counts",
}


# torchtitan's data parallelism is FSDP (its DDP composes with nothing else).
TRAINER_BASE = {"torchtitan": {"zero": 3}}


def _layout(trainer: str, axis: str) -> Layout:
    return layout_for(trainer, {**BASE, **TRAINER_BASE.get(trainer, {}), **AXES[axis]})


def _model(axis: str):
    if axis == "virtual_stages-pp4":
        return load_model("llama3-8b")  # 32 layers: 4 stages x 2 chunks
    return load_model("tiny-moe" if axis.startswith(("ep", "etp")) else "tiny-llama")


# --- Megatron-LM / Megatron-DeepSpeed: the arguments block and iteration lines ------------------
def _dests(argv: list[str]) -> dict[str, object]:
    """argparse's dest of each flag (store_true flags: True)."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i][2:].replace("-", "_")] = argv[i + 1] if takes else True
        i += 1 + takes
    return out


def _megatron_log(argv: list[str], layout: Layout, deepspeed: bool) -> str:
    args: dict[str, object] = {"sequence_parallel": False, "recompute_granularity": None,
                               "use_distributed_optimizer": False,
                               "num_virtual_stages_per_pipeline_rank": None}
    if not deepspeed:  # Megatron-DeepSpeed (4efb479) has neither argument
        args.update(context_parallel_size=1, expert_model_parallel_size=1)
    args.update(_dests(argv))
    if not deepspeed:  # validate_args: expert_tensor_parallel_size None -> tp (309ffca)
        args.setdefault("expert_tensor_parallel_size", args["tensor_model_parallel_size"])
    tp, pp = int(args["tensor_model_parallel_size"]), int(args["pipeline_model_parallel_size"])
    cp = int(args.get("context_parallel_size", 1))
    args["world_size"] = layout.world_size
    args["data_parallel_size"] = layout.world_size // (tp * pp * cp)
    virtual = args["num_virtual_stages_per_pipeline_rank"]
    args["virtual_pipeline_model_parallel_size"] = (
        None if virtual is None or int(virtual) == 1 else int(virtual))
    lines = ["------------------------ arguments ------------------------"]
    lines += sorted((f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()),
                    key=str.lower)
    lines.append("-------------------- end of arguments ---------------------")
    for it in range(1, 6):
        lines.append(f" iteration {it:8d}/{5:8d} | consumed samples: {it * 8:12d} | elapsed "
                     f"time per iteration (ms): {1000.0 + it:.1f} | global batch size: "
                     f"{layout.global_batch:5d} | lm loss: {9.0 / it:.6E} |")
    return "\n".join(lines) + "\n"


# --- torchtitan: the mesh, wrapping and checkpointing lines, the printed config, steps ----------
def _torchtitan_log(toml: str, layout: Layout) -> str:
    cfg = tomllib.loads(toml)
    par = cfg["parallelism"]
    rep, shard = par.get("data_parallel_replicate_degree", 1), par.get(
        "data_parallel_shard_degree", -1)
    cp, tp, pp = (par.get("context_parallel_degree", 1), par.get("tensor_parallel_degree", 1),
                  par.get("pipeline_parallel_degree", 1))
    ep, etp = par.get("expert_parallel_degree", 1), par.get("expert_tensor_parallel_degree", 1)
    if shard < 0:
        shard = layout.world_size // (rep * cp * tp * pp)
    stamp = "[rank0]:[titan] 2026-01-01 00:00:00,000 - root - INFO - "
    lines = [f"{stamp}Starting job: flm export round trip",
             f"{stamp}Running with configs: {json.dumps(cfg, indent=2)}",
             f"{stamp}Building device mesh with parallelism: pp={pp}, dp_replicate={rep}, "
             f"dp_shard={shard}, cp={cp}, tp={tp}, ep={ep}, etp={etp}"]
    mode = cfg["activation_checkpoint"]["mode"]
    if mode != "none":
        lines.append(f"{stamp}Applied {mode} activation checkpointing to the model")
    if shard * cp > 1:
        lines.append(f"{stamp}Applied {'HSDP' if rep > 1 else 'FSDP'} to the model")
    elif rep > 1:
        lines.append(f"{stamp}Applied DDP to the model")
    for step in range(1, 6):
        lines.append(f"{stamp}step: {step:2d}  loss: {9.0 / step:7.4f}  memory:  1.00GiB(1.00%)"
                     f"  tps: 1,000  tflops: 1.00  mfu: 0.10%")
    lines.append(f"{stamp}Training completed")
    return "\n".join(lines) + "\n"


# --- DeepSpeed: its own config class prints the engine's configuration block ------------------
class _DataParallel:
    """The mpu DeepSpeedConfig asks for the data-parallel world size (no process group)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _deepspeed_log(ds_config: str, layout: Layout, monkeypatch) -> str:
    from deepspeed.runtime import config as ds_runtime_config
    from deepspeed.utils import logger

    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_runtime_config.dist, "get_world_size",
                        lambda *a, **k: layout.world_size)
    config = ds_runtime_config.DeepSpeedConfig(json.loads(ds_config),
                                               mpu=_DataParallel(layout.dp))
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logger.handlers[0].formatter)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("DeepSpeed info: version=0.19.8, git-hash=unknown, git-branch=unknown")
        config.print("DeepSpeedEngine configuration")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [out.getvalue().rstrip("\n")]
    for step in range(1, 6):
        lines.append(f"[2026-01-01 00:00:0{step},000] [INFO] [logging.py:107:log_dist] "
                     f"[Rank 0] step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]")
        lines.append(f"[2026-01-01 00:00:0{step},000] [INFO] [timer.py:264:stop] epoch=0/"
                     f"micro_step={step}/global_step={step}, RunningAvgSamplesPerSec=8.0, "
                     "CurrSamplesPerSec=8.0, MemAllocated=0.1GB, MaxMemAllocated=0.2GB")
    return "\n".join(lines) + "\n"


def _trainer_log(trainer: str, model, layout: Layout, monkeypatch) -> str:
    t = get(trainer)
    if trainer == "torchtitan":
        return _torchtitan_log(export(trainer, model, layout), layout)
    if trainer == "deepspeed":
        pytest.importorskip("deepspeed")
        return _deepspeed_log(export(trainer, model, layout), layout, monkeypatch)
    return _megatron_log(t.argv(model, layout, "job"), layout, trainer == "megatron-deepspeed")


def _stated(layout: Layout, field: str) -> object:
    value = getattr(layout, field)
    return str(value) if field == "recompute" else value


CASES = [(t, a) for t in NAMES for a in AXES]


@pytest.mark.parametrize("trainer, axis", CASES, ids=[f"{t}-{a}" for t, a in CASES])
def test_export_log_read_back_is_the_same_layout(trainer, axis, tmp_path, monkeypatch):
    model = _model(axis)
    try:
        layout = get(trainer).check(model, _layout(trainer, axis))
        _trainer_log(trainer, model, layout, monkeypatch)  # the export itself may refuse
    except ExportRefused as exc:
        assert (trainer, axis) in REFUSED, f"{trainer} refused {axis}: {exc}"
        assert REFUSED[trainer, axis].lower() in str(exc).lower(), str(exc)
        assert trainer in str(exc)  # one line naming the trainer whose reason it is
        return
    assert (trainer, axis) not in REFUSED, f"{trainer} now runs {axis}: update REFUSED"
    path = tmp_path / f"{trainer}-{axis}.log"
    path.write_text(_trainer_log(trainer, model, layout, monkeypatch))
    reader = get(trainer).log_reader
    log = parse_log(path, trainer)
    assert len(log.runs) == 1, log.runs
    run = log.runs[0]
    assert run.status != "refused", run.error
    assert len(run.steps) == 5
    read = run.layout
    for field in FIELDS:
        if field in reader.unstated and field not in read:
            continue
        if field == "sharding":
            if layout.shard_ranks > 1:  # with one data-parallel rank nothing is sharded
                assert Sharding.parse(read[field]) == layout.sharding, read
        else:
            assert read.get(field) == _stated(layout, field), (field, read)


def test_every_axis_of_every_trainer_is_covered():
    """The table above is the whole vocabulary: each trainer x each axis is a case, and every
    refusal listed is one a trainer really gives (a stale entry fails the case above)."""
    assert {t for t, _ in CASES} == set(NAMES)
    assert {a for _, a in CASES} == set(AXES)
    assert {t for t, _ in REFUSED} <= set(NAMES) and {a for _, a in REFUSED} <= set(AXES)


def test_torchtitan_ep2_mesh_line_is_stored_with_ep_2(tmp_path):
    """Issue 49's reproduction: torchtitan's own mesh line with ep=2 (etp=1 = tp) then step lines
    is read as ep 2, and becomes a stored trace with ep 2 (not refused, not failed)."""
    from frontier_llm.logs.traces import LogOptions, build_trace

    stamp = "[rank0]:[titan] 2026-01-01 00:00:00,000 - root - INFO - "
    text = "\n".join(
        [f"{stamp}Starting job: Llama 4 debug training",
         f"{stamp}Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, "
         "cp=1, tp=1, ep=2, etp=1", f"{stamp}Applied FSDP to the model"]
        + [f"{stamp}step: {s:2d}  loss: {9.0 / s:7.4f}  memory:  1.00GiB(1.00%)  tps: 1,000  "
           "tflops: 1.00  mfu: 0.10%" for s in range(1, 6)]) + "\n"
    path = tmp_path / "titan.log"
    path.write_text(text)
    run = parse_log(path, "torchtitan").runs[0]
    assert run.status is None and (run.layout["ep"], run.layout["dp"]) == (2, 8)
    trace = build_trace(run, path, LogOptions(system="frontier", model="tiny-moe",
                                              layout={"micro_batch": 1, "global_batch": 8}))
    assert trace["status"] == "completed" and trace["layout"]["ep"] == 2
    # And through flm collect --from-logs into the store (SQLite), as the run was not.
    import sqlite3

    from frontier_llm.cli import main

    db = tmp_path / "flm.db"
    assert main(["collect", "--from-logs", str(path), "--trainer", "torchtitan", "--system",
                 "frontier", "--model", "tiny-moe", "--layout", "micro_batch=1,global_batch=8",
                 "--db", f"sqlite:///{db}", "--traces", str(tmp_path / "t"), "--quiet"]) == 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select r.status, l.ep from flm_runs r join flm_layouts l "
                            "on l.id = r.layout_id").fetchall()
    assert rows == [("completed", 2)]


def test_torchtitan_experts_without_tp_under_tp_are_read_as_etp_1(tmp_path):
    """etp = 1 under tp 2 with ep 2 (torchtitan allows it) is flm's etp 1 (issue 53: once
    refused, when flm's expert-tp was tp alone); etp = tp reads as the default, 0."""
    stamp = "[rank0]:[titan] 2026-01-01 00:00:00,000 - root - INFO - "
    for etp, want in ((1, 1), (2, 0)):
        path = tmp_path / f"titan-{etp}.log"
        path.write_text(f"{stamp}Building device mesh with parallelism: pp=1, dp_replicate=1, "
                        f"dp_shard=4, cp=1, tp=2, ep=2, etp={etp}\n{stamp}step:  3  loss:  "
                        "8.0000  memory:  1.00GiB(1.00%)  tps: 1,000\n")
        run = parse_log(path, "torchtitan").runs[0]
        assert run.status != "refused", run.error
        assert run.layout["etp"] == want and run.layout["ep"] == 2 and run.layout["tp"] == 2
