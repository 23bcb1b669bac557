"""Megatron-LM (``pretrain_gpt.py`` of NVIDIA/Megatron-LM ``core_v0.15.3``, 309ffca): its flags,
its refusals, the environment ``validate_args`` asserts, and its exit signal."""

from __future__ import annotations

from frontier_llm.costmodel.p2p_overlap import P2P_OVERLAP_FLAG, p2p_overlap_refusal
from frontier_llm.costmodel.tp_overlap import TP_OVERLAP_FLAG, tp_overlap_refusal
from frontier_llm.specs.layout import DType, Engine, Layout, PlacementKind, Schedule
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers.base import EnvVar, Trainer
from frontier_llm.trainers.deepspeed_config import bucket_elements
from frontier_llm.trainers.megatron_common import (
    DISTRIBUTED_OPTIMIZER_FLAG,
    FLAG,
    SEQUENCE_PARALLEL_FLAG,
    VIRTUAL_STAGES_FLAG,
    batch_and_degrees,
    dtype_args,
    model_args,
    moe_args,
    mtp_args,
    recompute_args,
    render_argv,
    stage_layer_args,
)
from frontier_llm.trainers.megatron_log import MegatronLog
from frontier_llm.trainers.refusals import check_engine_rules, refuse

# megatron/training/arguments.py validate_args at 309ffca: when tp > 1 or cp > 1 on a GPU
# before Blackwell (get_device_arch_version() < 10: A100, H100; MI250X's gfx90a reports 9) and
# neither FSDP is on, it asserts os.environ['CUDA_DEVICE_MAX_CONNECTIONS'] == "1" ("Using tensor
# model parallelism or context parallelism require setting the environment variable
# CUDA_DEVICE_MAX_CONNECTIONS to 1"). flm exports no FSDP for Megatron-LM, so tp or cp > 1
# always needs it (Blackwell tolerates it).
MAX_CONNECTIONS = EnvVar(
    "CUDA_DEVICE_MAX_CONNECTIONS", "1",
    "Megatron-LM core_v0.15.3 megatron/training/arguments.py validate_args asserts it when "
    "tp > 1 or cp > 1 before Blackwell")


OVERLAP_GRAD_REDUCE_FLAG = "--overlap-grad-reduce"
OVERLAP_PARAM_GATHER_FLAG = "--overlap-param-gather"
# Megatron-Core's overlap_p2p_comm (megatron/training/arguments.py at 309ffca,
# _add_distributed_args): ``--no-overlap-p2p-communication``, action='store_false',
# dest='overlap_p2p_comm', so the overlap is ON unless this flag is given; validate_args turns
# it off itself without virtual pipeline stages. flm prices every send exposed unless the user
# asks for the overlap (--overlap-p2p-comm on), so an interleaved layout's command carries the
# off-flag by default: the run is the one priced.
NO_OVERLAP_P2P_FLAG = "--no-overlap-p2p-communication"
# TransformerEngine's TP communication/GEMM overlap (megatron/training/arguments.py at 309ffca,
# _add_training_args: ``--tp-comm-overlap``, action='store_true', dest tp_comm_overlap; off
# unless given). flm's flag of the same name (TP_OVERLAP_FLAG) prices it; written only when
# the run was priced with it, so the command runs what was priced. Its sub-switches
# (--tp-comm-overlap-cfg, --disable-tp-comm-overlap-ag/-rs, ...) stay at Megatron's defaults.
TP_COMM_OVERLAP_FLAG = TP_OVERLAP_FLAG


def check_expert_tp(name: str, model: ModelSpec, layout: Layout) -> None:
    """Megatron-LM's rules on an etp other than tp (NVIDIA/Megatron-LM 309ffca): its MoE layer
    raises in training with attention tp > 1 and no sequence parallelism
    (megatron/core/transformer/moe/moe_layer.py: "performance may degrade if MoE and tensor
    parallelism are enabled without also enabling sequence parallelism"), and
    TransformerConfig asserts "Bias in Moe is only supported when ETP==1"
    (megatron/core/transformer/transformer_config.py)."""
    if not model.is_moe:
        return
    if layout.etp and layout.tp > 1 and not layout.sequence_parallel:
        raise refuse(name, f"etp {layout.etp} with tp {layout.tp} needs sequence parallelism "
                     "(its MoE layer raises \"performance may degrade if MoE and tensor "
                     "parallelism are enabled without also enabling sequence parallelism\": "
                     "megatron/core/transformer/moe/moe_layer.py at 309ffca): add "
                     "--sequence-parallel")
    if model.bias and layout.expert_tp != 1:
        raise refuse(name, f"an MoE model with biases at expert-tp {layout.expert_tp}: "
                     "TransformerConfig asserts \"Bias in Moe is only supported when ETP==1\" "
                     "(megatron/core/transformer/transformer_config.py at 309ffca); use --etp 1")


def _reduce_dtype(layout: Layout) -> DType:
    """The dtype its data-parallel reduction runs in: fp32 main gradients for bf16, and for fp8,
    whose main gradients stay fp32 (the GEMMs run in FP8; with --fp8-param-gather the linear
    weights are FP8 parameters, their fp32 masters in the distributed optimizer)."""
    return DType.FP32 if layout.dtype in (DType.BF16, DType.FP8) else layout.dtype


class MegatronLM(Trainer):
    name = "megatron-lm"
    aliases = ("megatron", "megatron_lm", "mlm", "megatron-core")
    title = "Megatron-LM"
    order = 1
    source = "Megatron-LM core_v0.15.3 (309ffca) megatron/training/arguments.py"
    engines = (Engine.MEGATRON,)
    log_reader = MegatronLog()
    step_flag = "--train-iters"
    save_flag = "--save"
    # --exit-signal-handler: "Dynamically save the checkpoint and shutdown the training if
    # SIGTERM is received" (arguments.py); training.py checks it after every iteration
    # (dist_signal_handler.DistributedSignalHandler, default signal.SIGTERM).
    exit_signal = "TERM"
    exit_argv = ("--exit-signal-handler",)
    takes_bucket = True  # --ddp-bucket-size
    takes_p2p_overlap = True  # --no-overlap-p2p-communication (NO_OVERLAP_P2P_FLAG)
    takes_tp_overlap = True  # --tp-comm-overlap (TP_COMM_OVERLAP_FLAG)

    def check(self, model: ModelSpec, layout: Layout, p2p_overlap: bool = False,
              tp_comm_overlap: bool = False) -> Layout:
        """The layout as Megatron-LM runs it, or ExportRefused; ``p2p_overlap``: the run
        overlaps its interleaved pipeline sends (flm's --overlap-p2p-comm), else not;
        ``tp_comm_overlap``: the run overlaps its TP collectives (flm's --tp-comm-overlap),
        which validate_args allows only with sequence parallelism."""
        sh = layout.sharding
        sharded = {sh.params.kind, sh.grads.kind} != {PlacementKind.REPLICATE}
        if layout.shard_ranks > 1 and sharded:
            raise refuse(self.name, f"sharding {sh.describe()}: its distributed optimizer "
                         "(--use-distributed-optimizer) shards optimizer states only (ZeRO-1); "
                         "sharded gradients and parameters are Megatron-FSDP (--use-megatron-fsdp"
                         " --data-parallel-sharding-strategy optim_grads|optim_grads_params at "
                         "core_v0.15.3), which flm's megatron engine does not model: export zero1,"
                         " or ZeRO-2/3 to megatron-deepspeed or torchtitan")
        if layout.ep > 1 and layout.tp > 1 and not layout.sequence_parallel:
            raise refuse(self.name, f"ep {layout.ep} with tp {layout.tp} needs sequence "
                         "parallelism (\"When using MoE with expert parallelism and tensor "
                         "parallelism, sequence parallelism must be enabled\": "
                         "megatron/core/transformer/moe/README.md at 309ffca): add "
                         "--sequence-parallel")
        check_expert_tp(self.name, model, layout)
        if model.mtp_layers and model.position not in ("rope",):
            raise refuse(self.name, f"mtp_layers {model.mtp_layers} with {model.position} "
                         "positions: validate_args asserts \"Multi-Token Prediction (MTP) is "
                         "not supported with learned_absolute position embedding type\" (rope "
                         "or none only; megatron/training/arguments.py at 309ffca)")
        if layout.ep > 1 and layout.dtype == DType.FP16:
            raise refuse(self.name, "ep > 1 with fp16: validate_args asserts \"Expert "
                         "parallelism is not supported with fp16 training\" "
                         "(megatron/training/arguments.py at 309ffca); use bf16")
        layout = check_engine_rules(self.name, Engine.MEGATRON, layout, model)
        if p2p_overlap and (why := p2p_overlap_refusal(layout)):
            raise refuse(self.name, why)
        if tp_comm_overlap and (why := tp_overlap_refusal(layout)):
            raise refuse(self.name, why)
        if layout.virtual_stages > 1 and layout.pp == 2 and not p2p_overlap:
            raise refuse(self.name, "interleaved with pp 2 and its pipeline sends not "
                         "overlapped (flm's default, as it prices them): validate_args asserts "
                         "\"When interleaved schedule is used and p2p communication overlap is "
                         "disabled, pipeline-model-parallel size should be greater than 2\" "
                         "(megatron/training/arguments.py at 309ffca); plan and export with "
                         f"{P2P_OVERLAP_FLAG} on (Megatron's default), or pp > 2")
        return layout

    def flags(self, model: ModelSpec, layout: Layout, bucket_mb: float | None = None,
              p2p_overlap: bool = False, tp_comm_overlap: bool = False) -> list[str]:
        """``pretrain_gpt.py`` flags (ExportRefused where it cannot run the layout);
        ``bucket_mb``: a tuned gradient bucket (flm tune best's run setting); ``p2p_overlap``:
        the interleaved schedule's sends overlapped with compute, as predicted with
        ``--overlap-p2p-comm on`` (Megatron's default: no flag), else the off-flag;
        ``tp_comm_overlap``: ``--tp-comm-overlap``, as predicted with ``--tp-comm-overlap on``
        (Megatron's default is off: no flag)."""
        layout = self.check(model, layout, p2p_overlap, tp_comm_overlap)
        argv = (model_args(model, deepspeed=False) + batch_and_degrees(layout)
                + moe_args(model, layout))
        if layout.cp > 1:
            # Its --cp-comm-type stays at its default, p2p: the ring exchange of K/V blocks
            # that the megatron engine stands for. Megatron's own seq-length check (a multiple
            # of 2 x cp) is the layout's (Layout.check_model).
            argv += [FLAG["cp"], str(layout.cp)]
        if layout.schedule == Schedule.INTERLEAVED:
            # --num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-pipeline-
            # stage, which validate_args refuses beside uneven ends.
            argv += [VIRTUAL_STAGES_FLAG, str(layout.virtual_stages)]
        if layout.virtual_stages > 1 and not p2p_overlap:
            argv.append(NO_OVERLAP_P2P_FLAG)
        # Megatron's split: the middle stages take the even share, the ends what the
        # --decoder-first/last flags give them (specs/pipeline_split.py).
        argv += stage_layer_args(model, layout)
        argv += mtp_args(model)
        if layout.sequence_parallel:
            argv.append(SEQUENCE_PARALLEL_FLAG)
        if tp_comm_overlap:  # check() refused it without sequence parallelism
            argv.append(TP_COMM_OVERLAP_FLAG)
        argv += recompute_args(layout)
        if layout.shard_ranks > 1:
            # The gradient reduction overlapped with backward, bucket by bucket, as flm's
            # megatron engine prices it; without it Megatron reduces once after backward and
            # drops --ddp-bucket-size (DistributedDataParallel sets bucket_size None when
            # overlap_grad_reduce is off: megatron/core/distributed/distributed_data_parallel.py
            # at 309ffca).
            argv.append(OVERLAP_GRAD_REDUCE_FLAG)
        if layout.zero_stage == 1 and layout.shard_ranks > 1:
            # The distributed optimizer shards optimizer states over the DP ranks: ZeRO-1. With
            # cp those are dp x cp (its data-parallel group "with context parallel", as flm's).
            # Its parameter all-gather overlaps the next forward (validate_args allows it only
            # with the distributed optimizer and --overlap-grad-reduce).
            argv += [DISTRIBUTED_OPTIMIZER_FLAG, OVERLAP_PARAM_GATHER_FLAG]
            if layout.dtype == DType.FP8:
                # FP8 parameters, all-gathered in FP8 (the cost model's assumption,
                # costmodel/fp8.py); arguments.py asserts the distributed optimizer for it.
                argv.append("--fp8-param-gather")
        argv += dtype_args(layout)
        if bucket_mb is not None:
            # --ddp-bucket-size counts parameters (DistributedDataParallelConfig.bucket_size,
            # core_v0.15.3): the elements of the reduced gradients in flm's bucket of MiB. bf16
            # gradients are accumulated and reduced in fp32 (validate_args sets
            # accumulate_allreduce_grads_in_fp32 for bf16), 4 bytes each.
            argv += ["--ddp-bucket-size", str(bucket_elements(bucket_mb, _reduce_dtype(layout)))]
        argv += ["--attention-backend", "flash" if layout.flash_attention else "unfused"]
        return argv

    def argv(self, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
        return self.flags(model, layout)

    def export_text(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
                    **options: object) -> str:
        bucket = options.get("bucket_mb")
        return render_argv(self.flags(model, layout, None if bucket is None else float(bucket),
                                      bool(options.get("p2p_overlap")),
                                      bool(options.get("tp_comm_overlap"))),
                           self.header(model, layout, system))

    def required_env(self, model: ModelSpec, layout: Layout) -> tuple[EnvVar, ...]:
        return (MAX_CONNECTIONS,) if layout.tp > 1 or layout.cp > 1 else ()


TRAINER = MegatronLM()
