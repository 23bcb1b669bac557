"""The run settings a plan is priced under, by name, mapped to planner.plan's keywords in one
place. flm plan (cli/run_settings.py reads its flags into a :class:`RunSettings`) and the Python
API (api.py takes them as keywords) both build one here, so a setting added to the planner is a
field of :class:`RunSettings`; the fields have no defaults, so a caller that does not give a
new one fails at once instead of pricing a run without it (the API once lacked ``eager`` and
the DeepSpeed overlap, and its curve every setting). The command line cannot be imported from
the API (.importlinter), hence this layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from frontier_llm.costmodel.moe import MoeRun
from frontier_llm.errors import UserError
from frontier_llm.specs.engine_rules import CP_EXCHANGES

# planner.plan's keywords that are a calibration row's, not a setting of flm plan (the row's
# stated reduction dtype, gradient sync, FP8 parameters and the K/V heads an older torchtitan's
# ring exchanged; planner/calibration.py). flm exports torchtitan v0.2.2, which moves kv heads.
CALIBRATION_ONLY = ("reduce_fp32", "grad_sync", "fp8_params", "cp_heads")


def switch(name: str, value: object) -> bool:
    """A run setting's on/off switch as a bool, a UserError naming it for anything else:
    'off' or 0 taken for on would price the run the user did not ask for."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be True or False (got {value!r})")
    return value


@dataclass(frozen=True)
class RunSettings:
    """One run's settings as flm plan names them: ``eager`` (``--eager``),
    ``deepspeed_overlap_comm`` (``--deepspeed-overlap-comm on``), ``tp_comm_overlap``
    (``--tp-comm-overlap on``), ``p2p_overlap`` (``--overlap-p2p-comm on``), ``moe_overlap``
    and ``moe_dispatcher`` (``--moe-overlap``, ``--moe-dispatcher``), ``cp_exchange``
    (``--cp-exchange``; None: the engine's rule). A value of the wrong kind is a UserError
    naming the setting: a switch given as 'off' taken for on would price another run."""

    eager: bool
    deepspeed_overlap_comm: bool
    tp_comm_overlap: bool
    p2p_overlap: bool
    moe_overlap: str
    moe_dispatcher: str
    cp_exchange: str | None

    def __post_init__(self) -> None:
        for name in ("eager", "deepspeed_overlap_comm", "tp_comm_overlap", "p2p_overlap"):
            switch(name, getattr(self, name))
        if self.cp_exchange is not None and self.cp_exchange not in CP_EXCHANGES:
            raise UserError(f"cp_exchange must be None or one of {', '.join(CP_EXCHANGES)} "
                            f"(got {self.cp_exchange!r})")
        self.moe_run()  # refuses an unknown overlap or dispatcher here, not deep in a plan

    def moe_run(self) -> MoeRun:
        try:
            return MoeRun(self.moe_overlap, self.moe_dispatcher)
        except ValueError as e:
            raise UserError(str(e)) from None

    def keywords(self) -> dict[str, object]:
        """planner.plan's run-setting keywords (all but :data:`CALIBRATION_ONLY`);
        planner.allocation.allocation_curve and planner.plan.in_dtype take the same."""
        return {
            "eager": self.eager,
            "overlap_comm": self.deepspeed_overlap_comm,
            "tp_comm_overlap": self.tp_comm_overlap,
            "p2p_overlap": self.p2p_overlap,
            "moe_run": self.moe_run(),
            "cp_exchange": self.cp_exchange,
        }


# flm plan's defaults: every setting as flm's own exports run it.
DEFAULTS = RunSettings(eager=False, deepspeed_overlap_comm=True, tp_comm_overlap=False,
                       p2p_overlap=False, moe_overlap="none", moe_dispatcher="alltoall",
                       cp_exchange=None)
NAMES = tuple(f.name for f in dataclasses.fields(RunSettings))
