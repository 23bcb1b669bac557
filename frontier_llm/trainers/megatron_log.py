"""Megatron-LM and Megatron-DeepSpeed logs (``pretrain_gpt.py``'s standard output).

What is read (docs/trainer-logs.md): the ``------------------------ arguments
------------------------`` block (every argument, ``  name ..... value``, up to ``end of
arguments``; ``context_parallel_size`` among them gives cp), ``using world size: N,
data-parallel-size: ...`` (with ``context-parallel size: C`` in newer Megatron-LM),
``> padded vocab (size: ...) ... (new size: V)``, the per-iteration lines (``iteration N/ M |
... | elapsed time per iteration (ms): T | throughput per GPU (TFLOP/s/GPU): F | ... | lm loss:
L | ...``; Megatron-DeepSpeed prints ``elapsed time per iteration (s):`` in seconds, and its
``TFLOPs:`` and ``tokens per gpu per second (tgs):`` too), the iteration line's ``global batch
size: B`` (the batch each step ran: ``--rampup-batch-size`` changes it), ``[after training is
done]``, and out-of-memory and error lines. A Mixture-of-Experts run's arguments give its
experts (``num_experts``, ``moe_router_topk``, ``moe_ffn_hidden_size``, ``moe_layer_freq``,
``moe_shared_expert_intermediate_size``, ``moe_aux_loss_coeff``, ``moe_expert_capacity_factor``)
and ``expert_model_parallel_size`` (ep); its iteration lines ``load_balancing_loss: X`` (the
router's aux loss over MoE blocks: ``track_moe_metrics`` adds it to the logged losses,
megatron/core/transformer/moe/moe_utils.py and megatron/training/training.py at 309ffca). A
new arguments block after iterations starts a new run.
"""

from __future__ import annotations

import contextlib
import re

from frontier_llm.trainers.log_reader import (
    LogReader,
    ParsedRun,
    Step,
    flag,
    integer,
    keep_batch,
    loss_number,
    number,
    read_dotted,
    read_memory_report,
    read_outcome,
)
from frontier_llm.trainers.megatron_common import (
    DEGREE_FLAGS,
    DISTRIBUTED_OPTIMIZER_FLAG,
    EXPERT_TP_FLAG,
    FLAG,
    KV_CHANNELS_FLAG,
    MLA_FLAG,
    MLA_FLAGS,
    MTP_FLAG,
    PRINTED,
    RECOMPUTE_FLAG,
    ROPE_BASE_FLAG,
    SEQUENCE_PARALLEL_FLAG,
    STAGE_LAYER_FLAGS,
    ZERO_STAGE_FLAG,
    dest,
)
from frontier_llm.trainers.megatron_pipeline_layout import given_ends_of

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)")
# The step-time field in each unit, with what divides it into seconds.
_ELAPSED = ((1000.0, "elapsed time per iteration (ms)"), (1.0, "elapsed time per iteration (s)"))
_WORLD = re.compile(r"using world size:\s*(\d+)")
# Megatron-LM prints "using world size: W, data-parallel size: D, context-parallel size: C,
# hierarchical context-parallel sizes: ..., tensor-model-parallel size: T, pipeline-model-parallel
# size: P" (megatron/training/arguments.py, core_v0.15.3); older ones no context part.
_DEGREE = re.compile(r"(data|context|tensor-model|pipeline-model)[- ]parallel[- ]size:\s*(\d+)")
_PADDED = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
_DS_VERSION = re.compile(r"DeepSpeed info: version=([^\s,]+)|deepspeed info \.+ ([^\s,]+)")
# Megatron's printed argument -> the layout degree or batch it states, from the flags the
# export writes (megatron_common.DEGREE_FLAGS) and the values validate_args computes (PRINTED).
_LAYOUT_ARGS = {**{dest(flag): field for flag, field in DEGREE_FLAGS.items()}, **PRINTED}
_MODEL_ARGS = {
    "num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
    "ffn_hidden_size": "ffn_hidden", "seq_length": "seq_len",
}
# The RoPE base under each trainer's dest (Megatron-LM rotary_base, Megatron-DeepSpeed
# rope_theta: megatron_common.ROPE_BASE_FLAG), read only for a rotary model.
_ROPE_BASE = (dest(ROPE_BASE_FLAG[False]), "rope_theta")
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
_DEGREE_FIELD = {"data": "dp", "context": "cp", "tensor-model": "tp", "pipeline-model": "pp"}


class MegatronLog(LogReader):
    name = "megatron"
    title = "Megatron-LM / Megatron-DeepSpeed"
    start = re.compile(r"-{5,}\s*arguments\s*-{5,}")
    signature = re.compile(r"elapsed time per iteration \((?:ms|s)\)|-{5,}\s*arguments\s*-{5,}"
                           r"|using world size: \d+, data-parallel")

    def read(self, run: ParsedRun, text: str) -> bool | None:
        if self.start.search(text):
            run.in_block = True
            return True
        if "end of arguments" in text:
            run.in_block = False
            return True
        if read_dotted(run, text):
            return True
        m = _ITER.search(text)
        if m:
            return self._iteration(run, m)
        if "elapsed time per iteration" in text:
            return False  # an iteration line cut short (a truncated file's last line)
        if m := _WORLD.search(text):
            run.world_size = integer(m.group(1), "world size")
            for kind, value in _DEGREE.findall(text):
                run.layout.setdefault(_DEGREE_FIELD[kind], integer(value, kind))
            return True
        if m := _PADDED.search(text):
            run.model["vocab"] = integer(m.group(1), "padded vocab")
            return True
        if m := _DS_VERSION.search(text):
            run.version = run.version or f"deepspeed {m.group(1) or m.group(2)}"
            return True
        if read_memory_report(run, text):
            return True
        if "[after training is done]" in text:
            run.finished = True
            return True
        return True if read_outcome(run, text) else None

    def _iteration(self, run: ParsedRun, m: re.Match) -> bool:
        fields = {}
        for part in m.group(3).split("|"):
            key, sep, value = part.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        # Megatron-LM prints milliseconds; Megatron-DeepSpeed (the forks run on LUMI and
        # Frontier, BigScience's) prints seconds, "elapsed time per iteration (s): 346.58": a
        # LUMI job and BLOOM-176B's logs (tests/data/trainer_logs/SOURCES.md).
        per_s, elapsed = next(((d, fields[k]) for d, k in _ELAPSED if k in fields), (1.0, None))
        if elapsed is None:
            return False
        try:
            step = Step(int(m.group(1)), number(elapsed.split("/")[0]) / per_s)
            if (batch := fields.get("global batch size")) is not None:
                step.global_batch = int(number(batch))
            if (loss := fields.get("lm loss")) is not None:
                step.loss = loss_number(loss)
            if (balance := fields.get("load_balancing_loss")) is not None:
                step.load_balancing_loss = number(balance)
            tflops = fields.get("throughput per GPU (TFLOP/s/GPU)") or fields.get("TFLOPs")
            if tflops is not None:
                step.tflops = number(tflops.split("/")[0])
            if (tgs := fields.get("tokens per gpu per second (tgs)")) is not None:
                step.tokens_per_s = number(tgs)
        except ValueError:
            return False
        run.total_steps = int(m.group(2))
        run.add_step(step)
        return True

    def finish(self, run: ParsedRun) -> None:
        a = run.args
        for arg, name in _LAYOUT_ARGS.items():
            if (value := integer(a.get(arg))) is not None:
                run.layout[name] = value
        keep_batch(run)
        if dest(FLAG["tp"]) in a:
            # The block prints every argument (vars(args)): a version without context or
            # expert parallelism (Megatron-DeepSpeed, Megatron-LM before them) runs neither.
            for field in ("cp", "ep"):
                run.layout.setdefault(field, 1)
            run.layout.setdefault("etp", 0)  # without the flag its experts ran at tp
            # validate_args prints None for one model chunk per pipeline rank.
            run.layout.setdefault("virtual_stages", 1)
            # --decoder-first/last-pipeline-num-layers: None (Megatron-DeepSpeed: absent) is
            # Megatron's own split, 0 in the layout ("not given").
            for stage_flag, field in STAGE_LAYER_FLAGS.items():
                run.layout[field] = integer(a.get(dest(stage_flag))) or 0
            _pipeline_layout(run)
        etp, tp = integer(a.get(dest(EXPERT_TP_FLAG))), run.layout.get("tp")
        if etp is not None and tp is not None:
            # validate_args prints tp here when the flag is not given: the layout's 0 ("tp").
            run.layout["etp"] = 0 if etp == tp else etp
        if (sp := flag(a.get(dest(SEQUENCE_PARALLEL_FLAG)))) is not None:
            run.layout["sequence_parallel"] = sp
        if (granularity := a.get(dest(RECOMPUTE_FLAG))) is not None:
            run.layout["recompute"] = "none" if granularity == "None" else granularity
        elif (whole := flag(a.get("checkpoint_activations"))) is not None:
            # Megatron-DeepSpeed and Megatron-LM before 2022 have no granularity:
            # --checkpoint-activations recomputes every layer's forward (full).
            run.layout["recompute"] = "full" if whole else "none"
        if (flash := flag(a.get("use_flash_attn"))) is not None:
            run.layout["flash_attention"] = flash
        dtype = _DTYPES.get(a.get("params_dtype", ""))
        if dtype is None and (flag(a.get("bf16")) or flag(a.get("fp16"))):
            dtype = "bf16" if flag(a.get("bf16")) else "fp16"
        if dtype:
            run.layout["dtype"] = dtype
        zero = integer(a.get(dest(ZERO_STAGE_FLAG)))
        if flag(a.get("deepspeed")) and zero is not None:
            run.layout["sharding"] = f"zero{zero}"  # Megatron-DeepSpeed's ZeRO stage
        elif (dist := flag(a.get(dest(DISTRIBUTED_OPTIMIZER_FLAG)))) is not None:
            run.layout["sharding"] = "zero1" if dist else "zero0"
        run.layout["engine"] = "megatron"
        if (world := integer(a.get("world_size"))) is not None:
            run.world_size = world
        self._model(run)

    @staticmethod
    def _model(run: ParsedRun) -> None:
        a = run.args
        for arg, name in _MODEL_ARGS.items():
            if (value := integer(a.get(arg))) is not None:
                run.model[name] = value
        if "vocab" not in run.model:
            vocab = integer(a.get("padded_vocab_size"))
            if vocab is not None:
                run.model["vocab"] = vocab
        if "heads" in run.model:
            groups = integer(a.get("num_query_groups"))
            gqa = flag(a.get("group_query_attention"))
            run.model["kv_heads"] = groups if gqa and groups else run.model["heads"]
        if flag(a.get(dest(MLA_FLAG))):
            for name, mla_flag in MLA_FLAGS.items():
                run.model[name] = integer(a.get(dest(mla_flag))) or 0  # q_lora_rank None: 0
        elif {"hidden", "heads"} <= run.model.keys():
            # kv_channels is printed always (validate_args sets hidden / heads): a head_dim
            # only where it is another width.
            width = integer(a.get(dest(KV_CHANNELS_FLAG)))
            if width and width * run.model["heads"] != run.model["hidden"]:
                run.model["head_dim"] = width
        if "swiglu" in a:
            run.model["activation"] = "swiglu" if flag(a["swiglu"]) else "gelu"
        if a.get("normalization"):
            run.model["norm"] = "rmsnorm" if a["normalization"] == "RMSNorm" else "layernorm"
        if a.get("position_embedding_type"):
            rope = "rope" in a["position_embedding_type"] or "rotary" in a[
                "position_embedding_type"]
            run.model["position"] = "rope" if rope else "learned"
            base = next((integer(a[k]) for k in _ROPE_BASE if k in a), None)
            if rope and base:
                run.model["rope_base"] = float(base)
        if (mtp := integer(a.get(dest(MTP_FLAG)))) is not None:
            run.model["mtp_layers"] = mtp  # --mtp-num-layers (None: printed without MTP)
        if (bias := flag(a.get("add_bias_linear"))) is not None:
            run.model["bias"] = bias
        if (untie := flag(a.get("untie_embeddings_and_output_weights"))) is not None:
            run.model["tied_embeddings"] = not untie
        _experts(run)


def _pipeline_layout(run: ParsedRun) -> None:
    """A printed ``pipeline_model_parallel_layout`` string as the given end stages it amounts
    to (trainers/megatron_pipeline_layout.py), or the run refused with why flm can not state
    its split (pricing Megatron's own split instead would be another run)."""
    text = run.args.get("pipeline_model_parallel_layout", "None")
    pp = integer(run.args.get(dest(FLAG["pp"])))
    if pp is None:
        return
    _accounted_ends(run, pp)
    if text in ("None", ""):
        return
    try:
        ends = given_ends_of(text, pp)
    except ValueError as exc:
        ends = str(exc)
    if isinstance(ends, str):
        run.status, run.error = "refused", (
            f"--pipeline-model-parallel-layout {text!r}: {ends}; flm states a split by its "
            "first and last stage's layers only (first_stage_layers / last_stage_layers)")
        return
    run.layout["first_stage_layers"], run.layout["last_stage_layers"] = ends


def _accounted_ends(run: ParsedRun, pp: int) -> None:
    """``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
    the embedding (loss) weighs one layer in the split, so the first (last) stage builds one
    layer fewer than the ``(layers + 1 [+ 1]) / pp`` the others do (get_num_layers_to_build at
    309ffca). Without interleaving that is a split by given ends; interleaved, only the first
    (last) chunk loses its layer, which flm can not state, and the run is refused."""
    a = run.args
    emb = bool(flag(a.get("account_for_embedding_in_pipeline_split")))
    loss = bool(flag(a.get("account_for_loss_in_pipeline_split")))
    layers = integer(a.get("num_layers"))
    if not (emb or loss) or layers is None:
        return
    vp = integer(a.get("virtual_pipeline_model_parallel_size")) or 1
    share, left = divmod(layers + emb + loss, pp)
    why = None
    if left or pp < 2:
        why = f"{layers} layers + {emb + loss} do not divide over pp {pp}"
    elif vp > 1:
        why = "interleaved, only the first/last chunk gives up its layer"
    elif share - 1 < 1:
        why = "a stage holding only the embedding or the loss"
    if why:
        run.status, run.error = "refused", (
            f"--account-for-embedding/loss-in-pipeline-split: {why}; flm states a split by its "
            "first and last stage's layers only (first_stage_layers / last_stage_layers)")
        return
    run.layout["first_stage_layers"] = share - 1 if emb else 0
    run.layout["last_stage_layers"] = share - 1 if loss else 0


def _experts(run: ParsedRun) -> None:
    """An MoE run's expert fields (none for a dense run: Megatron prints ``num_experts None``
    and its defaults, such as ``moe_router_topk 2``, which describe no model)."""
    a = run.args
    experts = integer(a.get("num_experts"))
    if not experts:
        return
    run.model["num_experts"] = experts
    if (topk := integer(a.get("moe_router_topk"))) is not None:
        run.model["top_k"] = topk
    width = integer(a.get("moe_ffn_hidden_size"))
    if width is not None:
        run.model["expert_ffn_hidden"] = width
    shared = integer(a.get("moe_shared_expert_intermediate_size"))
    if shared and width and shared % width == 0:
        run.model["shared_experts"] = shared // width
    freq = (a.get("moe_layer_freq") or "").strip()
    if freq.isdigit():
        run.model["moe_layer_freq"] = integer(freq, "moe_layer_freq")
    elif freq.startswith("["):
        # The printed list, one 0/1 per block: the spec's form is k leading dense blocks,
        # then an MoE block every N-th from the first; another pattern is left unread.
        # Linear in the list's length: trying each period against the whole list took over
        # 120 s for one 62 KB line.
        pattern = [int(x.strip("0") != "") for x in re.findall(r"\d+", freq)]
        dense = next((i for i, x in enumerate(pattern) if x), len(pattern))
        rest = pattern[dense:]
        ones = [i for i, x in enumerate(rest) if x]
        n = ones[1] if len(ones) > 1 else max(len(rest), 1)
        step = n if rest == [int(i % n == 0) for i in range(len(rest))] else None
        if rest and step is not None:
            run.model["dense_layers"] = dense
            run.model["moe_layer_freq"] = step
    types = a.get("moe_router_load_balancing_type", "")
    coeff = a.get("moe_aux_loss_coeff")
    if "aux_loss" in types and coeff not in (None, "None"):
        with contextlib.suppress(ValueError):  # a value it cannot be: left unread
            run.model["router_aux_loss"] = number(coeff.strip("[] ").split(",")[0])
    capacity = a.get("moe_expert_capacity_factor")
    if capacity not in (None, "None"):
        with contextlib.suppress(ValueError):
            run.model["capacity_factor"] = number(capacity)
