"""Predict published training runs (the calibration tables) and measure the error.

The tables are verbatim copies of ``../shared/data/calibration_runs.csv`` and
``calibration_runs_sharded.csv`` shipped in ``planner/data/`` (:data:`CALIBRATION_FILES`; their
columns and sources in that folder's README); :func:`load_calibration` reads both.

Protocol (docs/costmodel.md, "Calibration"): each row becomes a model (GPT-style: GeLU 4h MLP,
learned positions, tied embeddings, Megatron's 0.1 dropout; Llama-style where its notes name
SwiGLU, with the KV heads and MLP width they state), the catalog system for its GPU, the engine
its source ran (:func:`row_engine`) and a search space pinned to every knob the row states. Knobs
the row leaves empty (micro-batch, recompute, schedule, ZeRO stage, flash attention, and for some
rows TP/PP/DP) are searched over what that engine offers, and the fastest layout that fits is the
prediction, as the authors tuned theirs. The figure compared is the iteration time where the row
gives it, else TFLOP/s per GPU (hardware FLOPs where the notes say the source counts them), else
tokens/s per GPU, else the percentage of peak; a stated peak memory is compared beside it. No row
is treated specially: the same function runs on rows the model has never seen.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel.flops import narayanan_eq3
from frontier_llm.costmodel.moe import MoeRun
from frontier_llm.errors import UserError
from frontier_llm.planner.intervals import family, memory_verdict, vendor
from frontier_llm.planner.plan import memory_bounds, plan
from frontier_llm.planner.space import SearchSpace
from frontier_llm.specs.engine_rules import GRAD_SYNC_EACH, check_cp_exchange, rules_for
from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import Engine, Schedule, parse_schedule_label, zero_preset
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.sharding import Sharding
from frontier_llm.specs.system import SystemSpec

# "interleaved pipeline with 3 stages per rank": the interleaving depth a row's notes state.
_STAGES_PER_RANK = re.compile(r"(\d+)\s+(?:virtual\s+)?stages\s+per\s+rank", re.IGNORECASE)
_ONE_F_ONE_B = re.compile(r"\b1F1B\b", re.IGNORECASE)
# First match wins: the 500 W, HBM2e H100 of Meta's Grand Teton hosts is a system of its own.
# A row's GPU text -> its catalog system; the first key found in the lowercased text wins, so a
# machine that names its maker's GPU (an H100) must come before the GPU's default system.
# "gcp a3": Google Cloud's A3 (MaxText's configs/a3, "h100-80gb-8"), the 2023 machine Google
# now calls A3 High; A3 Mega, Ultra or Edge rows would need their own systems ahead of it.
# "gb200" before "b200", which it contains.
GPU_SYSTEMS = {"hbm2e": "grand-teton-h100", "gcp a3": "gcp-a3-high", "lumi": "lumi-g",
               "gb200": "gb200-nvl72", "b200": "dgx-b200", "h200": "dgx-h200",
               "mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x",
               "a100": "dgx-a100", "h100": "dgx-h100", "h800": "dgx-h800", "mi250x": "frontier"}
# The catalog systems a corpus row's ``system_hint`` may name.
SYSTEM_HINTS = frozenset(GPU_SYSTEMS.values())
DATA = Path(__file__).with_name("data")
# Every table of the corpus: ``calibration_runs.csv`` (the one the system knobs are fitted to:
# it sorts first) and each ``calibration_runs_*.csv`` beside it (the sharded table, the
# published runs brought in from ../shared/data, fp8 rows ...). Columns a table adds beyond
# the first's are carried along; one a table lacks is empty for its rows.
def corpus_files(folder: Path = DATA) -> tuple[Path, ...]:
    """The corpus tables in ``folder``, ``calibration_runs.csv`` first."""
    return tuple(sorted(Path(folder).glob("calibration_runs*.csv")))


CALIBRATION_FILES = corpus_files()
# What a row must state for its model to be built (an empty cell is never guessed).
ARCHITECTURE = ("layers", "hidden", "heads", "seq_len", "vocab")
# "400 Gbps inter-node" in a row's gpu_type: the network bandwidth its cluster had per node.
_NETWORK = re.compile(r"(\d+(?:\.\d+)?)\s*Gbps\s+inter-node", re.IGNORECASE)
# An Omni-Path network (Intel OPA): NCCL runs a communicator through one HFI (with_stated_network).
_OMNI_PATH = re.compile(r"omni-?path", re.IGNORECASE)
# "shard within 8-GPU node", "FSDP 8 within node": the shard group of two-level (HSDP) sharding.
_SHARD_GROUP = re.compile(r"(\d+)(?:-GPU)?\s+(?:node|within)", re.IGNORECASE)
# Per-GPU micro-batches tried when a row states neither its micro-batch nor its global batch.
UNSTATED_MICRO_BATCHES = (1, 2, 4, 8)
# GPT-3's batch by model size (Brown et al. 2020, arXiv 2005.14165, Table 2.1: 0.5M tokens up to
# 760M parameters, 1M up to 2.7B, 2M up to 13B, 3.2M for 175B), as sequences of its 2,048
# tokens: (largest parameter count, sequences). Megatron-DeepSpeed's GPT example scripts set
# exactly these global batches (examples_deepspeed/rebase/ds_pretrain_gpt_*.sh, and
# henkdr/Megatron-Deepspeed-LUMI@6d530461 lumi_ds_pretrain_gpt_13b.sh: 256 ... 1536).
GPT3_BATCH = ((0.76e9, 256), (2.7e9, 512), (13.0e9, 1024), (math.inf, 1536))
GPT3_SEQ_LEN = 2048
# "MFU 0.51, HFU 0.59" in a row's notes: the source's model and hardware FLOP utilisation.
_MFU_HFU = re.compile(r"MFU\s+(\d*\.?\d+),\s*HFU\s+(\d*\.?\d+)")
_KV_HEADS = re.compile(r"kv_heads\s+(\d+)", re.IGNORECASE)
_FFN = re.compile(r"\bffn\s+(\d+)", re.IGNORECASE)
_ZERO = re.compile(r"^\s*(\d)")
_YEAR = re.compile(r"((?:19|20)\d\d)")
# Flash attention (Dao et al., arXiv 2205.14135, May 2022): a source dated before it ran the
# unfused attention kernel.
FLASH_ATTENTION_YEAR = 2022
# Sequence parallelism and selective activation recomputation entered Megatron-LM with
# Korthikanti et al. (arXiv 2205.05198, May 2022; Megatron-LM v3.0): a source dated before
# them ran full recompute or none, and TP without sequence parallelism.
SEQUENCE_PARALLEL_YEAR = 2022


def _text(row: pd.Series, *cols: str) -> str:
    return " ".join(str(row.get(c)) for c in cols if _given(row.get(c))).lower()


def _engine_text(row: pd.Series) -> str:
    """What a row says it ran: the sharded table's engine column names the framework; the
    first table's rows name it in their source and notes (a blog titled "From DeepSpeed to
    FSDP" ran both)."""
    return _text(row, "engine") or _text(row, "source", "notes")


def row_engine(row: pd.Series) -> str:
    """The engine a row's source ran, read from its engine column, else its source and notes
    (first match wins):
    DeepSpeed named (Megatron-DeepSpeed too) -> ``deepspeed``; FSDP/FSDP2, TorchTitan or
    MaxText named -> ``native`` (PyTorch's FSDP2, the model's one engine of per-layer parameter
    gathers: FSDP1 and MaxText's FSDP axis gather and reduce-scatter layer by layer the same
    way); anything else (Megatron-LM's papers and README) -> ``megatron``."""
    text = _engine_text(row)
    if "deepspeed" in text:
        return "deepspeed"
    if any(word in text for word in ("fsdp", "torchtitan", "maxtext")):
        return "native"
    return "megatron"


# Model code that runs each PyTorch op as its own kernel unless compiled: PyTorch FSDP's and
# TorchTitan's Llama, Hugging Face models (under Accelerate, or xtuner's DeepSpeed).
_EAGER_CODE = ("fsdp", "torchtitan", "hugging face", "hf accelerate", "xtuner")
# Model code with fused element-wise kernels: Megatron's (apex/TransformerEngine, also under
# Megatron-DeepSpeed) and XLA's (MaxText).
_FUSED_CODE = ("megatron", "xla", "maxtext")


def row_eager(row: pd.Series) -> bool:
    """Whether the row's run executed its element-wise ops one kernel each
    (costmodel/steptime.py, EAGER_BYTES_PER_TOKEN) rather than fused.

    PyTorch runs a module eagerly unless it is compiled (``torch.compile`` is opt-in), so a run
    whose model is plain PyTorch code (:data:`_EAGER_CODE`) is eager unless its row names
    compilation; Megatron's and XLA's models (:data:`_FUSED_CODE`) fuse. Of the trainers here,
    fms-fsdp's README runs left ``use_torch_compile`` at its default, False
    (foundation-model-stack/fms-fsdp@0d319983 fms_fsdp/config/training.py; docs/configurations.md:
    "recommended to NOT use compile at this stage"), and TorchTitan's table row says "eager"."""
    text = _engine_text(row)
    if any(word in text for word in _FUSED_CODE):
        return False
    if "compile" in text.replace("no torch.compile", ""):
        return False
    return any(word in text for word in _EAGER_CODE)


def row_overlap_comm(row: pd.Series) -> bool:
    """Whether the row's DeepSpeed ran with ``overlap_comm`` on for its ZeRO-1/2 reductions
    (costmodel/steptime.py ``data_parallel_times``). Megatron-DeepSpeed's example recipes write
    ds_configs without the key (all 22 JSON configs under examples_deepspeed/ of
    microsoft/Megatron-DeepSpeed@f4157bea, among them rebase/ds_config_gpt_TEMPLATE.json, which
    the LUMI-G rows' lumi_ds_pretrain_gpt_13b.sh fills with only the stage), so DeepSpeed's
    default applies: off below stage 3 (deepspeed/runtime/zero/config.py
    ``overlap_comm_valid``). Other rows: flm's own setting, on."""
    return "megatron-deepspeed" not in _engine_text(row)


# Sources whose text states --tp-comm-overlap for every run they report, the rows whose notes
# do not repeat it included: the Megatron-LM README's experiments ("We perform fine-grained
# overlapping of data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel
# (--tp-comm-overlap) and pipeline-parallel communication", above its weak- and strong-scaling
# results).
TP_OVERLAP_SOURCES = ("MegatronLM-README-2024",)


def row_tp_comm_overlap(row: pd.Series) -> bool:
    """Whether the row's Megatron-LM ran with ``--tp-comm-overlap`` (its notes or its source
    say so); the others, as flm's Megatron-LM command, without."""
    return ("--tp-comm-overlap" in _text(row, "notes", "engine")
            or source_key(str(row.get("source") or "")) in TP_OVERLAP_SOURCES)


def row_p2p_overlap(row: pd.Series) -> bool:
    """Whether the row's interleaved Megatron schedule overlapped its pipeline sends with
    compute: its ``p2p_overlap`` column (the fp8 table's; each such row's notes quote the
    config's ``overlap_p2p_comm`` on: NeMo's MLPerf GPT-3 175B and Llama 3.1 405B
    ``conf/custom.yaml``, ``overlap_p2p_comm: ${oc.decode:${oc.env:OVERLAP_P2P_COMM,True}}``,
    the variable unset in their configs). A row that does not state it is priced as flm's
    Megatron-LM command and the knobs' H100 fit price it, every send exposed."""
    return _stated_true(row, "p2p_overlap")


def _torchtitan(row: pd.Series) -> bool:
    """Whether the row's source, notes or engine name torchtitan as its trainer."""
    return "torchtitan" in _text(row, "source", "notes", "engine")


def row_grad_sync(row: pd.Series) -> bool | None:
    """Whether the row's FSDP2 gradient accumulation reduce-scatters every micro-batch: its
    trainer's setting (specs/engine_rules.py ``GRAD_SYNC_EACH``), torchtitan's for a torchtitan
    row; None (the engine's rule) for the others."""
    if _torchtitan(row):
        return GRAD_SYNC_EACH["torchtitan"]
    return None


def row_cp_exchange(row: pd.Series) -> str | None:
    """The native engine's context-parallel exchange the row's trainer ran, as its
    ``cp_exchange`` column states it ("ring": PyTorch's ``context_parallel``, torchtitan's;
    "gather": flm bench's); None (the engine's rule) where the row states none."""
    if _given(row.get("cp_exchange")):
        return check_cp_exchange(str(row["cp_exchange"]).strip().lower())
    return None


def row_cp_heads(row: pd.Series) -> int | None:
    """The K/V heads the row's SDPA received, as its ``cp_heads`` column states it (the fp8
    table's; set where the row's source states a torchtitan that repeats K/V to every query
    head before SDPA: ``repeat_kv`` in torchtitan/models/llama/model.py at 9dec370, dropped in
    ff0829c, first released in v0.2.2). The flash kernel saves those K/V for backward
    (costmodel/memory.py ``layer_activation_bytes``) and a context-parallel ring gathers, sends
    and accumulates them (costmodel/steptime.py ``kv_exchange_bytes``). The name is the column's
    first use, the ring's, kept for the rows and callers that state it. None (the model's kv
    heads, as flm's torchtitan v0.2.2 runs it) where the row states none. A stated count must
    be a positive whole number of heads."""
    if not _given(row.get("cp_heads")):
        return None
    value = float(row["cp_heads"])
    if not value.is_integer() or value < 1:
        raise UserError(f"cp_heads must be a positive whole number of heads (got {value})")
    return int(value)


def row_reduce_fp32(row: pd.Series) -> bool | None:
    """Whether the row's gradients were reduced in fp32, where its framework says otherwise
    than the engine's rule (None: the rule; costmodel/steptime.py ``reduce_bytes``). PyTorch
    FSDP1's ``MixedPrecision`` reduces in its ``reduce_dtype``, which defaults to the
    ``param_dtype``; fms-fsdp, the code of the PyTorch blog's and fms-fsdp's rows, sets both to
    bf16 (its ``bfSixteen`` policy, foundation-model-stack/fms-fsdp@0d319983
    fms_fsdp/policies/mixed_precision.py, chosen by ``mixed_precision=True``, the default), where
    torchtitan's FSDP2 reduces in fp32. A DeepSpeed run that states BF16_Optimizer (BLOOM's
    BigScience fork) reduces its fp32 gradient copies (deepspeed/runtime/bf16_optimizer.py
    ``get_grads_for_reduction``), where DeepSpeed's ZeRO optimizer reduces in the training
    dtype; so does a Megatron-DeepSpeed run that states bf16 (:data:`_MDS_BF16`)."""
    if _given(row.get("grad_reduce_dtype")):
        # A row that states its gradient buffer's dtype (the fp8 table's column: NeMo's MLPerf
        # scripts pass grad_reduce_in_fp32=False to Megatron-Core's DDP config).
        return str(row["grad_reduce_dtype"]).strip().lower() == "fp32"
    text = _engine_text(row)
    if "bf16_optimizer" in text or _MDS_BF16.search(text):
        return True
    if _torchtitan(row):
        # torchtitan's FSDP2 MixedPrecisionPolicy reduces in --training.mixed_precision_reduce,
        # default and only choice "float32" (torchtitan/config_manager.py at 9dec370;
        # parallelisms/parallelize_llama.py passes it as reduce_dtype).
        return True
    return False if "fsdp1" in text else None


# A Megatron-DeepSpeed row that trained in bf16: both halves of that code accumulate and reduce
# its gradients in fp32. Megatron's: "bfloat16 requires gradient accumulation and all-reduce to
# be done in fp32" (microsoft/Megatron-DeepSpeed@db97cd2a megatron/arguments.py, which forces
# ``accumulate_allreduce_grads_in_fp32``; Megatron-LM 50a4b5fa, April 2021). DeepSpeed's: its
# one bf16 pipeline optimizer, BF16_Optimizer (PR #1801), "is hardcoded for fp32 gradient
# accumulation" (deepspeed/runtime/pipe/engine.py at 38327e07), bf16 accumulation in a pipeline
# being "not safe numerically with large number of accumulation steps" (runtime/engine.py
# ``_do_optimizer_sanity_check``). costmodel/steptime.py prices it as BF16_Optimizer's
# per-micro-batch fp32 accumulation (``HP_GRAD_ACCUMULATE_BYTES``) and fp32 reduction.
_MDS_BF16 = re.compile(r"megatron-deepspeed.*\bbf16\b")


def row_fp8_params(row: pd.Series) -> bool:
    """Whether the row's Megatron FP8 run kept its weights as FP8 parameters
    (``--fp8-param-gather``, NeMo's ``fp8_params``, MLPerf's FP8_PARAMS=True): its
    ``fp8_params`` column (the fp8 table's); a row that does not state it ran without, as
    Megatron-LM's default is (costmodel/fp8.py ``fp8_params``)."""
    return _stated_true(row, "fp8_params")


def _stated_true(row: pd.Series, column: str) -> bool:
    """Whether the row's ``column`` states true (empty: not stated, False)."""
    if not _given(row.get(column)):
        return False
    return str(row[column]).strip().lower() in ("true", "1", "yes")


def row_zero_stage(row: pd.Series) -> int | None:
    """The ZeRO stage a row states: a leading digit, or 3 for FSDP's full sharding."""
    if not _given(row.get("zero_stage")):
        return None
    text = str(row["zero_stage"])
    match = _ZERO.match(text)
    if match:
        return int(match.group(1))
    if "full shard" in text.lower():
        return 3
    raise UserError(f"zero_stage {text!r}: not a ZeRO stage")


def row_shardings(row: pd.Series, gpus_per_node: int) -> tuple[Sharding, ...] | None:
    """The shardings a row's ``zero_stage`` cell allows: a ZeRO stage; FSDP's full shard
    (ZeRO-3); two-level sharding (HSDP, MaxText's FSDP-in-node x DP-across-nodes) over the
    shard group it names: every state sharded in groups of that size, replicated across them;
    FSDP without a strategy: full shard or HSDP within a node (PyTorch FSDP's two strategies
    that shard parameters). None when the row states nothing."""
    if not _given(row.get("zero_stage")):
        return None
    text = str(row["zero_stage"]).lower()
    dp = int(row["dp"]) if _given(row.get("dp")) else int(row["num_gpus"])
    group = _SHARD_GROUP.search(text)
    if "hsdp" in text or (group and "within" in text):
        return (_hsdp(int(group.group(1)) if group else gpus_per_node, dp),)
    if "fsdp" in text and "not stated" in text:
        return tuple(dict.fromkeys((zero_preset(3), _hsdp(gpus_per_node, dp))))
    return (zero_preset(row_zero_stage(row)),)


def _hsdp(group: int, dp: int) -> Sharding:
    """States sharded over groups of ``group`` DP ranks, replicated across groups (HSDP); a
    group as large as DP is full sharding."""
    if group >= dp:
        return zero_preset(3)
    return Sharding.parse(f"p=partial:{group},g=partial:{group},o=partial:{group}")


def _given(value) -> bool:
    return not (value is None or (isinstance(value, float) and math.isnan(value)) or value == "")


def load_runs(path: str | Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None


def source_key(source: str) -> str:
    """The source a row belongs to: the first word of its ``source`` cell (one paper,
    repository or blog: ``Korthikanti2022``, ``fms-fsdp``, ``MaxText``)."""
    return str(source).split()[0]


def load_calibration(paths=CALIBRATION_FILES) -> pd.DataFrame:
    """Both calibration tables, one frame: each row with its ``file``, its ``row`` number in
    that file and its ``source_key``."""
    frames = []
    for path in paths:
        frame = load_runs(path)
        frame.insert(0, "row", range(len(frame)))
        frame.insert(0, "file", Path(path).name)
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    out["source_key"] = out["source"].map(source_key)
    return out


def unused_reason(row: pd.Series) -> str | None:
    """Why a corpus row is kept but not predicted (its ``unused`` cell: a duplicate of another
    row, a layout or architecture its source does not state ...); None for a row in use."""
    return str(row["unused"]) if _given(row.get("unused")) else None


# The Mixture-of-Experts columns a row may state (calibration_runs_moe.csv): ModelSpec fields
# of the same names.
MOE_COLUMNS = ("num_experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers",
               "n_group", "topk_group")


def _moe_fields(row: pd.Series) -> dict:
    """The MoE fields a row states (none for a dense model's row); ``router_balance`` as its
    column says (the router its source trained or benchmarked with)."""
    if not _given(row.get("num_experts")):
        return {}
    out = {c: int(row[c]) for c in MOE_COLUMNS if _given(row.get(c))}
    if _given(row.get("router_balance")):
        out["router_balance"] = str(row["router_balance"])
    return out


def row_moe_run(row: pd.Series) -> MoeRun:
    """How the row's MoE run dispatched and overlapped its all-to-alls, as its notes or engine
    name it (Megatron-LM's flags, DeepSeek's DualPipe); Megatron-LM's defaults otherwise."""
    text = _text(row, "notes", "engine")
    overlap = ("dualpipe" if "dualpipe" in text else
               "ep-a2a" if "--overlap-moe-expert-parallel-comm" in text else "none")
    flex = "deepep" in text or "dispatcher-type flex" in text
    return MoeRun(overlap, "flex" if flex else "alltoall")


def _catalog_row_model(row: pd.Series) -> ModelSpec:
    """The catalog model a row names in its ``catalog_model`` column (an architecture the
    columns cannot carry: DeepSeek-V3's multi-head latent attention, dense first blocks and
    multi-token prediction), checked against every architecture column the row states; the
    row's ``router_balance`` replaces the catalog's where given (the router its run used)."""
    model = load_model(str(row["catalog_model"]).strip())
    stated = {c: int(row[c]) for c in (*ARCHITECTURE, *MOE_COLUMNS) if _given(row.get(c))}
    wrong = {c: (v, getattr(model, c)) for c, v in stated.items() if getattr(model, c) != v}
    if wrong:
        raise UserError(f"row {row['model']!r} disagrees with catalog model {model.name!r}: "
                        + ", ".join(f"{c} {v} vs {m}" for c, (v, m) in wrong.items()))
    if _given(row.get("router_balance")):
        model = dataclasses.replace(model, router_balance=str(row["router_balance"]))
    return model


def row_model(row: pd.Series) -> ModelSpec:
    if _given(row.get("catalog_model")):
        return _catalog_row_model(row)
    shape = dict(name=str(row["model"]), layers=int(row["layers"]), hidden=int(row["hidden"]),
                 heads=int(row["heads"]), seq_len=int(row["seq_len"]), vocab=int(row["vocab"]),
                 **_moe_fields(row))
    notes = str(row.get("notes") or "")
    if "swiglu" in notes.lower() or "llama" in str(row["model"]).lower():
        # Llama style (the catalog's llama3 models; every Llama is SwiGLU, RMSNorm, RoPE,
        # untied: Touvron et al. 2023): the notes state what differs from a GPT.
        kv, ffn = _KV_HEADS.search(notes), _FFN.search(notes)
        return ModelSpec(**shape, kv_heads=int(kv.group(1)) if kv else None,
                         ffn_hidden=int(ffn.group(1)) if ffn else None, activation="swiglu",
                         norm="rmsnorm", position="rope", bias=False, tied_embeddings=False,
                         dropout=0.0)
    # Multi-query attention (Shazeer 2019; BigCode's --attention-head-type multiquery): one
    # key/value head shared by all query heads.
    multiquery = re.search(r"multi-?query", _text(row, "model", "engine", "notes"))
    return ModelSpec(**shape, kv_heads=1 if multiquery else None, tied_embeddings=True,
                     dropout=0.1)


def row_system(row: pd.Series, systems: dict[str, SystemSpec] | None = None) -> SystemSpec:
    """The catalog system of the row's GPU; where its gpu_type states the cluster's network
    ("400 Gbps inter-node"), that bandwidth shared by the node's GPUs replaces the catalog's
    per-GPU network link (a DGX has one NIC per GPU; the PyTorch FSDP blog's A100 cluster had
    400 Gbit/s per node)."""
    gpu = str(row["gpu_type"]).lower()
    hint = str(row.get("system_hint") or "").strip()
    if hint in SYSTEM_HINTS:
        # The corpus names the catalog system of a row whose GPU text names only its family
        # ("NVIDIA Ampere GPUs") or its site.
        system = (systems or {}).get(hint) or load_system(hint)
        return with_stated_network(system, str(row["gpu_type"]))
    for key, name in GPU_SYSTEMS.items():
        if key in gpu:
            system = (systems or {}).get(name) or load_system(name)
            return with_stated_network(system, str(row["gpu_type"]))
    raise UserError(f"no catalog system for GPU type {row['gpu_type']!r}")


def with_stated_network(system: SystemSpec, gpu_type: str) -> SystemSpec:
    """``system`` with the per-GPU network bandwidth ``gpu_type`` states per node, if any.

    A network stated as Omni-Path has no rails (specs/system.py ``LinkTier.rails``): NCCL
    drives Omni-Path through its IB verbs transport, and on Jean Zay's A100 nodes (the BLOOM
    rows' cluster) it ran a communicator's ring channels through one HFI: BigScience's
    all-reduce benchmark over 4 of those nodes logs both channels ``via NET/IB/1`` and a bus
    bandwidth of 39.9 Gbit/s for a 4 GB fp32 all-reduce (bigscience-workshop/bigscience@74c6c3d
    experiments/bandwidth/n4_a100_all_reduce_bench.txt, NCCL 2.10.3, the version of the
    PyTorch 1.11 BLOOM trained with: train/tr11-176B-ml/README.md). One NIC's share of the
    stated 400 Gbit/s at the catalog's collective efficiency is 0.8 x 50 = 40 Gbit/s, the
    measured rate; with rails the model would give a ring with 4 members a node 160."""
    stated = _NETWORK.search(gpu_type)
    if not stated:
        return system
    per_gpu = float(stated.group(1)) * 1e9 / 8 / system.gpus_per_node
    net = dataclasses.replace(system.links["network"], bandwidth=per_gpu,
                              source=f"the run's stated {stated.group(0)}",
                              rails=not _OMNI_PATH.search(gpu_type))
    return dataclasses.replace(system, links={**system.links, "network": net})


def recompute_counted(row: pd.Series) -> bool | None:
    """Whether the row's own TFLOP/s figure counts a recomputed forward, where its source counts
    one only when recompute ran (``flops_kind``: "... incl. recompute if enabled") and the row
    also gives its token rate; None otherwise.

    Megatron-DeepSpeed's ``throughput_calculator`` (megatron/utils.py; henkdr/Megatron-
    Deepspeed-LUMI@6d530461 lines 285-293) multiplies Narayanan et al.'s eq. 3 by 4 instead of
    3 when ``--checkpoint-activations`` (or a recompute granularity) is set, so the figure over
    the token rate times eq. 3's FLOPs per token is 4/3 with recompute and 1 without: the row
    states its recompute in its own numbers even where the column is empty."""
    if not ("recompute if enabled" in _text(row, "flops_kind")
            and _given(row.get("tflops_per_gpu")) and _given(row.get("tokens_per_s_per_gpu"))):
        return None
    model = row_model(row)
    per_token = narayanan_eq3(model, 1) / model.seq_len
    counted = float(row["tflops_per_gpu"]) * 1e12 / (float(row["tokens_per_s_per_gpu"])
                                                     * per_token)
    return counted > (1 + 4 / 3) / 2


def replayed_share(row: pd.Series) -> float | None:
    """The share of blocks a row's block-level checkpointing replays, where it leaves the share
    unstated (FSDP's "checkpoint every n-th block", n not given) but its notes give the
    source's MFU and HFU; None otherwise.

    HFU counts the replayed forwards and MFU does not (the PyTorch FSDP blog counts both with
    PyTorch's FLOP counter): a step is three forwards' worth of FLOPs, and replaying a share
    ``f`` of the blocks adds ``f`` of a forward, so HFU / MFU = (3 + f) / 3 and
    f = 3·(HFU / MFU − 1), clipped to [0, 1] (the head, never replayed, makes it a slight
    underestimate)."""
    if "block-level" not in _text(row, "act_recompute"):
        return None
    stated = _MFU_HFU.search(str(row.get("notes") or ""))
    if not stated:
        return None
    mfu, hfu = float(stated.group(1)), float(stated.group(2))
    return min(1.0, max(0.0, 3 * (hfu / mfu - 1)))


def row_cp(row: pd.Series) -> int:
    """The context-parallel degree a row states (its ``cp`` cell), 1 where it states none: the
    ``dp`` column counts data-parallel replicas only, so tp x cp x pp x dp = num_gpus."""
    return int(row["cp"]) if _given(row.get("cp")) else 1


def row_space(row: pd.Series, gpus_per_node: int = 8) -> SearchSpace:
    """Pin what the row states; leave the rest to the search."""
    def pinned(col):
        return (int(row[col]),) if _given(row.get(col)) else None

    kw: dict = {"tp": pinned("tp"), "pp": pinned("pp"), "micro_batch": pinned("micro_batch")}
    if _given(row.get("ep")):
        kw["ep"] = pinned("ep")
    # Context parallelism as the row's ``cp`` column states it (MLPerf's Llama 3.1 405B configs
    # export CONTEXT_PARALLEL); a table without the column, or an empty cell, states a run that
    # did not split sequences (none of the older sources did), so cp 1 is pinned, never searched.
    kw["cp"] = pinned("cp") or (1,)
    engine = rules_for(row_engine(row))
    year = _YEAR.search(str(row.get("source") or ""))
    if year and int(year.group(1)) < FLASH_ATTENTION_YEAR:
        kw["flash_attention"] = (False,)
    before_sp = bool(year and int(year.group(1)) < SEQUENCE_PARALLEL_YEAR)
    if before_sp:
        kw["sequence_parallel"] = (False,)
        kw["recompute"] = ("none", "full")
    recompute = str(row.get("act_recompute") or "")
    lowered = recompute.lower()
    if _given(row.get("act_recompute")):
        if lowered.startswith("none"):
            kw["recompute"] = ("none",)
        elif "block-level" in lowered:
            # FSDP's "selective" checkpoints every n-th block, n unstated: between none and
            # full, both searched.
            kw["recompute"] = ("none", "full")
        elif "remat" in lowered and "minimal" in lowered:
            # MaxText's ``minimal`` remat policies save the matmul outputs and rerun the
            # element-wise work: op-level selective checkpointing.
            kw["recompute"] = ("selective-op",)
        elif recompute.startswith("full"):
            kw["recompute"] = ("full",)
            kw["flash_attention"] = (False,)
        elif recompute.startswith("selective") and engine.engine == Engine.NATIVE:
            # PyTorch-native "selective" is torchtitan's op-level selective checkpointing
            # (its llama3_8b.toml: mode 'selective', selective_ac_option 'op'), over SDPA,
            # whose default kernel is flash attention.
            kw["recompute"] = ("selective-op",)
        elif recompute.startswith("selective"):
            # Megatron's selective recomputation (Korthikanti et al. 2022 §4.2) exists to drop
            # the unfused attention core's scores; a run that states it ran the unfused kernel.
            kw["recompute"] = ("selective",)
            kw["flash_attention"] = (False,)
        if "sequence parallel" in recompute:
            kw["sequence_parallel"] = (True,)
    elif (counted := recompute_counted(row)) is not None:
        # Megatron-DeepSpeed's --checkpoint-activations (the flag its factor 4 counts)
        # checkpoints whole transformer layers: full recompute.
        kw["recompute"] = ("full",) if counted else ("none",)
    if "fp16" in _text(row, "engine"):
        # The engine column names the training precision where it is not bf16.
        kw["dtype"] = "fp16"
    if _text(row, "dtype") == "fp8":
        # calibration_runs_fp8.csv states the precision and the FP8 recipe in columns.
        kw["dtype"] = "fp8"
        kw["fp8_recipe"] = (_text(row, "fp8_recipe") or "tensorwise",)
    if "flash" in _text(row, "engine"):
        # The engine column names the attention kernel the run used (FlashAttention-2,
        # flash-attn, cuDNN flash): it ran whatever the recompute.
        kw["flash_attention"] = (True,)
    # The schedule, where stated, is in the notes (or the engine column of the later tables).
    notes = " ".join(str(row.get(c) or "") for c in ("notes", "engine"))
    if "interleaved" in notes:
        depth = _STAGES_PER_RANK.search(notes)
        # "interleaved, 4 stages per rank" is the schedule interleaved:4; without a depth the
        # planner tries every one.
        text = f"interleaved:{depth.group(1)}" if depth else "interleaved"
        kw.update({k: (v,) for k, v in parse_schedule_label(text).items()
                   if depth or k == "schedule"})
    elif _ONE_F_ONE_B.search(notes):
        # A row that names 1F1B and no interleaving ran the plain schedule, one stage a rank.
        # The schedule's label parser owns what "1f1b" means for the stage count.
        kw.update({k: (v,) for k, v in parse_schedule_label(str(Schedule.ONE_F_ONE_B)).items()})
    if _torchtitan(row) and (kw["pp"] or (1,))[0] > 1:
        # torchtitan keeps each stage's parameters gathered from forward to backward: "For PP,
        # do not reshard after forward to avoid per-microbatch all-gathers" (apply_fsdp,
        # torchtitan/parallelisms/parallelize_llama.py at 9dec370).
        kw["reshard_after_forward"] = (False,)
    # The search covers what the sources' framework offers: Megatron-LM shards nothing or the
    # optimizer states (its distributed optimizer, ZeRO-1), and schedules pipelines with 1F1B or
    # interleaved 1F1B (Megatron-DeepSpeed's pipelines likewise take ZeRO-0/1 only).
    stated = row_shardings(row, gpus_per_node)
    kw["sharding"] = (stated if stated is not None else
                      tuple(s for s in (zero_preset(0), zero_preset(1))
                            if engine.runs_sharding(s)))
    kw.setdefault("schedule", tuple(str(s) for s in engine.schedules
                                    if s != Schedule.GPIPE))
    kw.setdefault("flash_attention", (False, True))
    if not engine.sequence_parallel:
        kw["sequence_parallel"] = (False,)
    kw["engine"] = (str(engine.engine),)
    return SearchSpace(**kw)


def row_batches(row: pd.Series) -> tuple[int, ...]:
    """Global batches to try: the one stated; for Megatron-style trainers (Megatron-LM,
    Megatron-DeepSpeed), whose launch scripts always set ``--global-batch-size`` and accumulate
    micro-batches up to it, GPT-3's batch for the model's size (:data:`GPT3_BATCH`, as many
    tokens at the row's sequence length, a multiple of DP); else one micro-batch per DP rank
    per step (the stated micro-batch, or each of :data:`UNSTATED_MICRO_BATCHES`): FSDP and
    MaxText step the optimizer once per batch unless told to accumulate, and none of these rows
    says it did."""
    if _given(row.get("global_batch")):
        return (int(row["global_batch"]),)
    gpus = int(row["num_gpus"])
    dp = (int(row["dp"]) if _given(row.get("dp"))
          else gpus // (int(row.get("tp") or 1) * int(row.get("pp") or 1) * row_cp(row)))
    if row_engine(row) == str(Engine.MEGATRON) or "megatron" in _text(row, "engine"):
        params = (float(row["params_b"]) * 1e9 if _given(row.get("params_b"))
                  else row_model(row).num_params)
        sequences = next(n for limit, n in GPT3_BATCH if params <= limit)
        sequences = sequences * GPT3_SEQ_LEN / int(row["seq_len"])
        return (max(dp, round(sequences / dp) * dp),)
    micro = ((int(row["micro_batch"]),) if _given(row.get("micro_batch"))
             else UNSTATED_MICRO_BATCHES)
    return tuple(m * dp for m in micro)


def unstated_architecture(row: pd.Series) -> list[str]:
    """The architecture columns a row leaves empty (its model cannot be built)."""
    return [c for c in ARCHITECTURE if not _given(row.get(c))]


def _best(row: pd.Series, model: ModelSpec, system: SystemSpec, recompute: str | None = None):
    """(plan, index) of the fastest layout over the row's batches, those predicted to fit
    first (with ``recompute`` pinned, if given); None when no layout has the row's DP
    degree."""
    found = []
    space = row_space(row, system.gpus_per_node)
    if recompute is not None:
        space = dataclasses.replace(space, recompute=(recompute,))
    for batch in row_batches(row):
        result = plan(model, system, int(row["num_gpus"]), batch, space, eager=row_eager(row),
                      overlap_comm=row_overlap_comm(row), reduce_fp32=row_reduce_fp32(row),
                      tp_comm_overlap=row_tp_comm_overlap(row), moe_run=row_moe_run(row),
                      grad_sync=row_grad_sync(row), fp8_params=row_fp8_params(row),
                      p2p_overlap=row_p2p_overlap(row), cp_exchange=row_cp_exchange(row),
                      cp_heads=row_cp_heads(row))
        # A published run ran: when none of its layouts is predicted to fit, the fastest is
        # predicted anyway (after those that fit) and the table says it was predicted not to fit.
        order = result.ranked_indices(fits_only=False)
        if _given(row.get("dp")):
            order = order[result.layouts.dp[order] == int(row["dp"])]
        # The run ran: the fastest layout whose point estimate fits, whatever its verdict (the
        # planner ranks tight layouts after those that fit; a published layout is not
        # reconstructed by that caution).
        f = result.figures
        order = order[np.lexsort((f["peak_memory_bytes"][order], -f["tokens_per_s"][order],
                                  ~f["fits"][order]))]
        # When none fits, the run still ran: the layout nearest to fitting (least memory)
        # stands for it, not the fastest of those that could not have run.
        if len(order) and not f["fits"][order].any():
            order = order[np.argsort(f["peak_memory_bytes"][order], kind="stable")]
        if len(order):
            i = int(order[0])
            found.append((not result.figures["fits"][i],
                          -result.figures["tokens_per_s"][i], len(found), result, i))
    if not found:
        return None
    best = min(found)
    return best[3], best[4]


def _blend(row: pd.Series, model: ModelSpec, system: SystemSpec, share: float):
    """Figures of a run that replays ``share`` of its blocks: each block costs what it costs
    without recompute or with full recompute, so the step time is the share-weighted mean of
    the two layouts' (and their activation memory, held per block, likewise); rates follow
    the step time. ((figures, (plan, index) of the no-recompute layout), or None when either
    layout has no prediction.)"""
    none, full = (_best(row, model, system, r) for r in ("none", "full"))
    if none is None or full is None:
        return None
    a = {k: float(v[none[1]]) for k, v in none[0].figures.items()}
    b = {k: float(v[full[1]]) for k, v in full[0].figures.items()}
    step = (1 - share) * a["step_time_s"] + share * b["step_time_s"]
    slower = step / a["step_time_s"]
    peak = (1 - share) * a["peak_memory_bytes"] + share * b["peak_memory_bytes"]
    # The cost model's own test of fit (costmodel.evaluate), on the blended peak.
    fig = {**a, "step_time_s": step, "peak_memory_bytes": peak,
           "fits": peak <= system.memory_bytes}
    for rate in ("tokens_per_s", "mfu", "model_tflops_per_gpu"):
        fig[rate] = a[rate] / slower
    # Hardware FLOPs: each layout's per step, weighted the same way, over the blended step.
    for hw in ("hfu", "hardware_tflops_per_gpu"):
        fig[hw] = ((1 - share) * a[hw] * a["step_time_s"]
                   + share * b[hw] * b["step_time_s"]) / step
    return fig, none


def predict_row(row: pd.Series, systems: dict[str, SystemSpec] | None = None) -> dict:
    """The best layout's figures for one published row, beside the published figure."""
    reason = unused_reason(row)
    if reason is not None:
        return {"metric": None, "measured": None, "predicted": None, "error": math.nan,
                "layout": f"not used: {reason}", "engine": row_engine(row)}
    missing = unstated_architecture(row)
    if missing:
        return {"metric": None, "measured": None, "predicted": None, "error": math.nan,
                "layout": f"not predictable: {', '.join(missing)} not stated",
                "engine": row_engine(row)}
    model, system = row_model(row), row_system(row, systems)
    share = replayed_share(row)
    blended = _blend(row, model, system, share) if share is not None else None
    if blended is not None:
        fig, (result, best) = blended
    else:
        found = _best(row, model, system)
        if found is None:
            return {"metric": None, "measured": None, "predicted": None, "error": math.nan,
                    "layout": "no layout fits", "engine": row_engine(row)}
        result, best = found
        fig = {k: float(v[best]) for k, v in result.figures.items()}
    counted = None  # which FLOPs a TFLOP/s figure counts
    # Tokens per second is what a run measures; a TFLOP/s figure depends on the source's FLOP
    # count, so it is compared only where no token rate is given.
    if _given(row.get("iteration_time_s")):
        metric, measured, predicted = "iteration_time_s", row["iteration_time_s"], fig[
            "step_time_s"]
    elif _given(row.get("tokens_per_s_per_gpu")):
        metric, measured, predicted = ("tokens_per_s_per_gpu", row["tokens_per_s_per_gpu"],
                                       fig["tokens_per_s"] / int(row["num_gpus"]))
    elif _given(row.get("tflops_per_gpu")):
        counted = ("hardware" if "hardware tflop" in _text(row, "notes", "flops_kind")
                   else "model")
        metric, measured, predicted = ("tflops_per_gpu", row["tflops_per_gpu"],
                                       fig[f"{counted}_tflops_per_gpu"])
    else:
        metric, measured, predicted = "pct_peak", row["pct_peak"], 100 * fig["mfu"]
    cfg = result.layout(best)
    memory = {}
    if _given(row.get("memory_gb")):
        # memory_gb is GiB of the allocator's peak reserved (the README): the predicted device
        # peak less what lies outside the allocator, the context and the collective library's
        # buffers (costmodel/reserve.py); fragmentation is the allocator's own.
        got = (fig["peak_memory_bytes"] - fig["mem_context_bytes"]
               - fig["mem_collective_bytes"]) / 2**30
        memory = {"memory_gib": float(row["memory_gb"]), "memory_predicted_gib": got,
                  "memory_error": (got - float(row["memory_gb"])) / float(row["memory_gb"])}
    return {
        "metric": metric, "measured": float(measured), "predicted": predicted,
        "error": (predicted - measured) / measured, "flops_counted": counted,
        "engine": str(cfg.engine),
        "family": family(str(cfg.engine), cfg.sharding.describe(), vendor(system),
                         model.is_moe, str(cfg.dtype) == "fp8"),
        "layout": label(cfg) + (f" + full recompute of {share:.0%} of blocks" if blended
                                else ""),
        "peak_memory_gb": fig["peak_memory_bytes"] / 1e9,
        "capacity_gb": system.memory_bytes / 1e9,
        "mfu_predicted": fig["mfu"], "fits": bool(fig["fits"]),
        "memory_verdict": verdict(fig["peak_memory_bytes"], system.memory_bytes),
        **memory,
    }


def verdict(peak: float, capacity: float) -> str:
    """``fits`` / ``tight`` / ``exceeds`` of one peak (planner/intervals.py's rule, over the
    memory interval of :func:`~frontier_llm.planner.plan.memory_bounds`)."""
    low, high = memory_bounds(np.array([peak]))
    return str(memory_verdict(low, high, capacity)[0])


def validate_runs(runs: pd.DataFrame, systems: dict[str, SystemSpec] | None = None
                  ) -> pd.DataFrame:
    """One row per published run: what was measured, what the model predicts, the error."""
    rows = []
    for _, row in runs.iterrows():
        out = predict_row(row, systems)
        # A row kept but not used may name hardware the catalog lacks (an H800, a TPU).
        try:
            system = row_system(row, systems).name
        except UserError:
            if unused_reason(row) is None:
                raise
            system = ""
        rows.append({"source": source_key(row["source"]), "model": row["model"],
                     "gpu": row["gpu_type"], "system": system,
                     "gpus": int(row["num_gpus"]) if _given(row.get("num_gpus")) else None,
                     **out})
    return pd.DataFrame(rows)


def error_summary(table: pd.DataFrame) -> dict[str, float]:
    err = table["error"].abs()
    return {"rows": len(table), "mape": float(np.nanmean(err)), "max": float(np.nanmax(err))}
