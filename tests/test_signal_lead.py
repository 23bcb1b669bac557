"""Issue 39: a trainer job's pre-deadline signal comes early enough to save ITS checkpoint
(jobs/signal_lead.py). Real sweep loading and rendering; the cost model's own state bytes."""

from __future__ import annotations

import math
import re

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel.memory import rank_state_bytes
from frontier_llm.jobs import signal_lead
from frontier_llm.jobs.sweepdir import render_sweep
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.jobs.walltime import OvertimeError
from frontier_llm.specs.layout import Layout

SWEEP = """\
name: t175
model: {model}
system: frontier
workload: megatron-deepspeed
workload_command: [python, /lustre/orion/proj/Megatron-DeepSpeed/pretrain_gpt.py,
                   --train-iters, "1"]
resources: {{time: "{time}", account: ABC123}}
layouts:
  - {{tp: 8, pp: 16, dp: {dp}, micro_batch: 1, global_batch: 1024, recompute: full, name: a}}
"""


def _sweep(tmp_path, model="gpt-175b", time="02:00:00", dp=8):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP.format(model=model, time=time, dp=dp))
    return load_sweep(path)


def _signal(text: str) -> int:
    return int(re.search(r"^#SBATCH --signal=TERM@(\d+)$", text, re.M).group(1))


def test_checkpoint_bytes_are_parameters_and_optimizer_states_once():
    """14 bytes per bf16 parameter (2 parameter + 12 fp32 master and Adam moments), counted
    once however the layout splits them: ~2.46 TB for 175B."""
    model = load_model("gpt-175b")
    a = Layout(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1024, dtype="bf16")
    b = Layout(tp=8, pp=16, dp=1, micro_batch=1, global_batch=1024, dtype="bf16")
    size = signal_lead.checkpoint_bytes(model, a)
    assert size == signal_lead.checkpoint_bytes(model, b)
    per_stage = sum(rank_state_bytes(model, a, r)["params_bytes"] for r in range(16)) * 8
    assert size == pytest.approx(per_stage * 7, rel=1e-9)  # 2 + 12 bytes against 2
    assert 2.4e12 < size < 2.5e12


def test_175b_on_128_frontier_nodes_computes_its_lead_from_the_sources(tmp_path):
    """128 nodes write at min(Orion's 4.6 TB/s, 128 x 100 GB/s) = 4.6 TB/s: ~0.5 s of writing;
    x2 + one step + 60 s exit is under Frontier's 300 s, which stays."""
    sweep = _sweep(tmp_path)
    job = sweep.jobs[0]
    assert job.nodes == 128
    site = load_system("frontier").site
    assert (site.checkpoint_write_gbps, site.node_write_gbps) == (4600, 100)
    size = signal_lead.checkpoint_bytes(job.model, job.layout)
    wanted = size / min(4600e9, 128 * 100e9) * 2.0 + job.prediction["step_time_s"] + 60.0
    manifest = render_sweep(sweep, tmp_path / "out")
    text = (manifest.directory / manifest.jobs[0]["script"]).read_text()
    assert wanted < 300 and _signal(text) == 300 == manifest.jobs[0]["signal_lead_s"]


def test_a_long_step_and_a_big_checkpoint_raise_the_lead_above_the_sites(tmp_path):
    """dp 1 on 16 nodes: min(4.6 TB/s, 16 x 100 GB/s) = 1.6 TB/s, and a step of minutes the
    trainer finishes before it saves: the lead is the sum, above 300 s."""
    sweep = _sweep(tmp_path, dp=1)
    job = sweep.jobs[0]
    size = signal_lead.checkpoint_bytes(job.model, job.layout)
    wanted = size / (16 * 100e9) * 2.0 + job.prediction["step_time_s"] + 60.0
    manifest = render_sweep(sweep, tmp_path / "out")
    text = (manifest.directory / manifest.jobs[0]["script"]).read_text()
    assert wanted > 300 and _signal(text) == math.ceil(wanted)
    assert not any("signal lead" in w for w in manifest.data["warnings"])


def test_a_tiny_model_keeps_the_sites_minimum(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(SWEEP.format(model="tiny-llama", time="02:00:00", dp=1)
                    .replace("tp: 8, pp: 16, dp: 1", "tp: 1, pp: 1, dp: 8")
                    .replace("global_batch: 1024, recompute: full", "global_batch: 8"))
    manifest = render_sweep(load_sweep(path), tmp_path / "out")
    text = (manifest.directory / manifest.jobs[0]["script"]).read_text()
    assert _signal(text) == 300


def test_the_cap_warns_when_the_job_cannot_checkpoint_in_time(tmp_path):
    """20 minutes: at most a quarter (300 s) is held back; the dp 1 job wants ~440 s."""
    sweep = _sweep(tmp_path, time="00:20:00", dp=1)
    manifest = render_sweep(sweep, tmp_path / "out")
    text = (manifest.directory / manifest.jobs[0]["script"]).read_text()
    assert _signal(text) == 300
    lines = [w for w in manifest.data["warnings"] if w.startswith("signal lead:")]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "layout a (16 nodes)" in lines[0] and "2.46 TB checkpoint" in lines[0]
    assert "raise --time or save less" in lines[0]


def test_the_walltime_check_counts_the_lead_as_time_without_training(tmp_path):
    """10 minutes: start-up and one step with the margin fit (~510 s), but not with the
    150 s (a quarter of the walltime) the job spends saving and exiting."""
    with pytest.raises(OvertimeError, match=r"\+ 150 s signal lead \(checkpoint and exit\), "
                                            r"over its --time 00:10:00"):
        render_sweep(_sweep(tmp_path, time="00:10:00", dp=1), tmp_path / "out")


def test_a_bandwidth_that_is_not_a_positive_number_is_refused_in_one_line():
    from frontier_llm.errors import SpecError
    from frontier_llm.specs.site import site_from_mapping
    with pytest.raises(SpecError, match=r"^site.node_write_gbps must be a positive number"):
        site_from_mapping({"node_write_gbps": 0})


@pytest.mark.parametrize("system, nodes_word", [("lumi-g", "project_465000000"),
                                                ("dgx-h100", None)])
def test_trainer_jobs_on_sites_without_a_stated_lead_are_signalled(tmp_path, system,
                                                                   nodes_word):
    """LUMI and the DGX systems state no pre-deadline lead, so a trainer job there got no
    signal at all and was killed mid-step at its limit, its last checkpoint lost. The lead is
    now the checkpoint's own (write time x SAFETY + one step + exit), from the site's write
    bandwidth."""
    text = SWEEP.format(model="gpt-22b", time="02:00:00", dp=1).replace(
        "system: frontier", f"system: {system}").replace(
        "tp: 8, pp: 16,", "tp: 8, pp: 1,").replace("global_batch: 1024", "global_batch: 64")
    text = text.replace("/lustre/orion/proj/", "/scratch/p/")
    text = text.replace("account: ABC123", f"account: {nodes_word}" if nodes_word
                        else "partition: gpu")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    sweep = load_sweep(path)
    manifest = render_sweep(sweep, tmp_path / "out")
    script = manifest.path(manifest.groups[0]["script"]).read_text()
    lead = _signal(script)
    job = sweep.jobs[0]
    found = signal_lead.lead(None, sweep.site, job.model, job.layout, job.nodes,
                             job.prediction.get("step_time_s"), 7200)
    assert found is not None and lead == found.seconds >= signal_lead.EXIT_S
