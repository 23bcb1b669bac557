"""What every trainer object is: the one place a trainer's names, files, flags, environment and
refusals live (docs/export.md "The trainer registry").

A trainer module (``megatron_lm.py``, ``torchtitan.py`` ...) defines one subclass of
:class:`Trainer` and a module-level ``TRAINER`` instance; ``trainers/__init__.py`` finds it. The
export (``flm export``), trainer sweeps (``jobs/workload.py``), the job templates and log
ingestion (``flm collect --from-logs``, ``python -m frontier_llm.logs.job``) ask the registry and
never name a trainer themselves.

A trainer owns its log reader (``log_reader``, a :class:`~frontier_llm.trainers.log_reader.
LogReader` of its ``*_log.py`` module, which reads through the same vocabulary the exporter
writes with); ``logs/traces.py`` turns every parsed run into a trace with the one builder,
``build_trace``, and never names a trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers.log_reader import LogReader
from frontier_llm.trainers.text import comment_lines


@dataclass(frozen=True)
class EnvVar:
    """A variable the trainer requires, with the trainer's own reason (file and version)."""

    name: str
    value: str
    why: str


# The launcher's rank variables as torch.distributed's env:// start reads them. Under srun they
# come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (srun man page, OUTPUT ENVIRONMENT
# VARIABLES); torchrun sets its own.
SRUN_RANK = '"$SLURM_PROCID"'
SRUN_WORLD = '"$SLURM_NTASKS"'
SRUN_LOCAL = '"$SLURM_LOCALID"'


class Trainer:
    """One trainer. Subclasses set the names and implement :meth:`check`, :meth:`argv`,
    :meth:`files` and :meth:`export_text`."""

    name = ""  # the canonical name: flm export --to, a sweep's workload:
    aliases: tuple[str, ...] = ()  # other spellings users and older files use
    title = ""
    order = 0  # position in lists (help text, errors)
    source = ""  # the version its names were read from (docs/export.md cites file and commit)
    # The flm engines standing for it (specs/engine_rules.py): a layout that names no engine
    # gets the first that builds it, and --from-plan plans with them.
    engines: tuple[Engine, ...] = ()
    # How its context parallelism exchanges K/V, where it runs the native engine's (the cost
    # model's ``cp_exchange``, specs/engine_rules.py CP_EXCHANGE): --from-plan plans with it,
    # and a plan asked for another is refused. None: the engines' own.
    cp_exchange: str | None = None
    log_reader: LogReader = LogReader()  # reads the logs it prints (flm collect --from-logs)
    step_flag: str | None = None  # how many optimizer steps it runs (the walltime check)
    save_flag: str | None = None  # the checkpoint directory flag (one per sweep job)
    # The signal on which it saves a checkpoint and stops, and the flag that makes it listen.
    exit_signal: str | None = None
    exit_argv: tuple[str, ...] = ()
    # Whether its text takes a tuned gradient bucket (flm tune's bucket_mb run setting).
    takes_bucket = False
    # Whether its text renders the interleaved pipeline's p2p overlap (Megatron-Core's
    # overlap_p2p_comm; flm's --overlap-p2p-comm): flm export refuses the setting elsewhere.
    takes_p2p_overlap = False
    # Whether its text renders Megatron-LM's --tp-comm-overlap (flm's --tp-comm-overlap): flm
    # export refuses the setting elsewhere, naming what the trainer has instead.
    takes_tp_overlap = False
    # The trainer's own words for what it has in place of --tp-comm-overlap (flm export's
    # refusal); torchtitan's async TP is another mechanism and not priced, so never mapped.
    tp_overlap_instead = "no TP communication/GEMM overlap flm renders"
    # Whether its flags name the file of files() (Megatron-DeepSpeed's ds_config): flm export
    # --ds-config PATH writes it there.
    argv_names_files = False

    def check(self, model: ModelSpec, layout: Layout) -> Layout:
        """The layout as this trainer runs it, or ExportRefused (one line: the trainer's own
        reason)."""
        raise NotImplementedError

    def run_settings(self, p2p_overlap: bool = False, tp_comm_overlap: bool = False
                     ) -> dict[str, bool]:
        """A plan's run settings as :meth:`check` takes them, each only where this trainer
        renders it (Megatron-LM: interleaved pp 2 runs only with the p2p overlap, and the TP
        overlap needs sequence parallelism); a trainer without one refuses it in export()."""
        run = {}
        if p2p_overlap and self.takes_p2p_overlap:
            run["p2p_overlap"] = True
        if tp_comm_overlap and self.takes_tp_overlap:
            run["tp_comm_overlap"] = True
        return run

    def argv(self, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
        """What a sweep job appends to the user's command; config files are in ``job_dir``."""
        raise NotImplementedError

    def files(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
              **options: object) -> dict[str, str]:
        """The files a sweep job's folder gets, by name (empty when flags say everything)."""
        return {}

    def export_text(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
                    **options: object) -> str:
        """What ``flm export --to NAME`` prints."""
        raise NotImplementedError

    def required_env(self, model: ModelSpec, layout: Layout) -> tuple[EnvVar, ...]:
        """Variables the trainer refuses to run without, for this layout."""
        return ()

    def notes(self, model: ModelSpec, layout: Layout, **options: object) -> list[str]:
        """What ``flm export`` says on stderr beside the text (the user's part of the job)."""
        out = [f"set {v.name}={v.value} in the job: {v.why}"
               for v in self.required_env(model, layout)]
        if options.get("bucket_mb") is not None and not self.takes_bucket:
            out.append(f"{self.title} has no gradient bucket size setting: the tuned bucket_mb "
                       f"{options['bucket_mb']:g} is not in the export")
        return out

    def rank_env(self, binding: str) -> dict[str, str]:
        """RANK, WORLD_SIZE and LOCAL_RANK for a rank started by srun under the site's GPU
        binding (specs/site.py): shell text, expanded in each rank's shell.

        Every trainer here picks its GPU from LOCAL_RANK: Megatron-LM ``set_device(
        args.local_rank)`` with ``--local-rank`` defaulting to LOCAL_RANK (core_v0.15.3
        megatron/training/initialize.py, arguments.py), torchtitan ``cuda:LOCAL_RANK``
        (v0.2.2 torchtitan/train.py), DeepSpeed's ``init_distributed`` and engine, and so
        Megatron-DeepSpeed, which asserts its device (rank mod visible devices) equals it.
        Under ``--gpu-bind=closest`` each rank sees one GPU, relabelled 0 (OLCF's PyTorch
        example sets the device to 0 there): SLURM_LOCALID would name a device it cannot see.
        With CPU masks (LUMI) or no binding every rank sees all the node's GPUs and takes its
        own, SLURM_LOCALID."""
        local = '"0"' if binding == "closest" else SRUN_LOCAL
        return {"RANK": SRUN_RANK, "LOCAL_RANK": local, "WORLD_SIZE": SRUN_WORLD}

    def header(self, model: ModelSpec, layout: Layout,
               system: SystemSpec | None = None) -> list[str]:
        """The comment lines above flags or TOML: what, for what, from which source."""
        where = f" on {system.name}" if system is not None else ""
        lines = [f"flm export --to {self.name}: {model.name}{where}, {label(layout)}",
                 f"names from {self.source}"]
        lines += [f"required: export {v.name}={v.value} ({v.why})"
                  for v in self.required_env(model, layout)]
        return lines

    def comment(self, model: ModelSpec, layout: Layout,
                system: SystemSpec | None = None) -> str:
        return comment_lines(self.header(model, layout, system))
