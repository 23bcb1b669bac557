"""Site rules refused before anything is written; sweeps inherit and override the site;
custom templates that extend a shipped one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier_llm.errors import SpecError
from frontier_llm.jobs.render import render
from frontier_llm.jobs.sweepdir import job_scripts, render_sweep
from frontier_llm.jobs.sweepspec import load_sweep

OLCF = "https://docs.olcf.ornl.gov/systems/frontier_user_guide.html"


def _sweep(tmp_path: Path, body: str, system: str = "frontier", name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"name: t\nmodel: tiny-gpt\nsystem: {system}\ndtype: fp32\n{body}")
    return path


RULES = [
    # (sweep body, the start of the one-line refusal, where its source points)
    ("layouts: [{dp: 800}]\nresources: {time: '07:00:00', account: A}\n",
     "site rule frontier.time_bins: a job of 100 nodes (92-183 bin) may run at most 06:00:00; "
     "it asks for 07:00:00", OLCF + "#job-priority-by-node-count"),
    ("layouts: [{dp: 1, micro_batch: 1}, {dp: 1, micro_batch: 2}]\n"
     "resources: {qos: debug, account: A}\n",
     "site rule frontier.queues: qos debug allows no job arrays; this script is an array of 2",
     OLCF + "#debug-quality-of-service-class"),
    ("layouts: [{dp: 1}, {dp: 2}]\nresources: {qos: debug, account: A}\n",
     "site rule frontier.queues: qos debug lets a user have 1 job(s); the sweep has 2",
     OLCF + "#debug-quality-of-service-class"),
    ("layouts: [{dp: 1}, {dp: 2}, {dp: 4}]\nresources: {account: A}\nsite: {max_queued_jobs: 2}\n",
     "site rule frontier.max_queued_jobs: a user may queue 2 jobs (each array task counts); the "
     "sweep has 3: split it", OLCF + "#batch-partition-queue-policy"),
    ("layouts: [{dp: 8}]\nresources: {cpus_per_task: 8, account: A}\n",
     "site rule frontier.usable_cores_per_node: 8 ranks x 8 CPUs = 64 cores per node, over the "
     "56 usable", OLCF + "#low-noise-mode-layout"),
    ("layouts: [{dp: 8}]\n",
     "site rule frontier.account_required: an account (project) is required", OLCF),
]


LUMI = "https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/"
# Rules of the second pass (issue 26): (system, sweep body, refusal start, source).
RULES_2 = [
    ("frontier", "layouts: [{dp: 8}]\nresources: {partition: standard-g, account: A}\n",
     "site rule frontier.partitions: partition 'standard-g' is not one of frontier's (batch, "
     "extended)", OLCF + "#batch-partition-queue-policy"),
    ("frontier", "layouts: [{dp: 8}]\nresources: {qos: urgent, account: A}\n",
     "site rule frontier.qos_names: qos 'urgent' is not one of frontier's (normal, debug)", OLCF),
    ("lumi-g", "layouts: [{dp: 8}]\nresources: {partition: batch, account: project_1}\n",
     "site rule lumi-g.partitions: partition 'batch' is not one of lumi-g's (standard-g, "
     "small-g, dev-g)", LUMI + "partitions/"),
    ("lumi-g", "layouts: [{dp: 8}]\nresources: {account: ABC123}\n",
     "site rule lumi-g.account_pattern: account 'ABC123' is not of the site's form "
     "'project_[0-9]+'", LUMI + "batch-job/#specifying-the-account"),
    ("lumi-g", "layouts: [{dp: 16}]\nresources: {account: project_1}\n",
     "site rule lumi-g.net_plugin_modules: a job of 2 nodes loads no network plugin",
     "https://docs.lumi-supercomputer.eu/software/packages/pytorch/"),
    ("frontier", "layouts: [{dp: 16}]\nresources: {account: A}\nenvironment: {modules: [rocm]}\n",
     "site rule frontier.net_plugin_modules: a job of 2 nodes loads no network plugin",
     "https://docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html"),
    ("frontier", "layouts: [{dp: 520}]\nresources: {partition: extended, account: A}\n",
     "site rule frontier.queues: partition extended allows at most 64 nodes; a job asks for 65",
     OLCF + "#extended-partition-queue-policy: 24 h, 64 nodes)"),  # its own anchor, not debug's
    ("lumi-g", "layouts: [{dp: 8}]\nresources: {account: project_1}\n"
               "template_options: {stage_env: /scratch/env.tar.gz}\n",
     "site rule lumi-g.stage_dir: template_options.stage_env: lumi-g documents no node-local "
     "storage", ""),
    ("dgx-h100", "template: frontier\nlayouts: [{dp: 8}]\n",
     "site rule dgx-h100.template: template frontier is a frontier template; dgx-h100 jobs use "
     "the nvidia family", ""),
]


@pytest.mark.parametrize("system,body,message,source", RULES_2, ids=lambda v: str(v)[:24])
def test_second_pass_site_rules(system, body, message, source, tmp_path, monkeypatch):
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    sweep = load_sweep(_sweep(tmp_path, body, system=system))
    with pytest.raises(SpecError) as err:
        render_sweep(sweep, tmp_path / "out")
    text = str(err.value)
    assert "\n" not in text and text.startswith(message), text
    assert source in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("system,body", [
    # extended: 24 h for up to 64 nodes; the 2-hour bin of 1-91 nodes is batch's only.
    ("frontier", "layouts: [{dp: 16}]\nresources: {partition: extended, time: '20:00:00', "
                 "account: A}\n"),
    # A LUMI multi-node job with the plugin's module, or the AI guide's container bindings.
    ("lumi-g", "layouts: [{dp: 16}]\nresources: {account: project_465000000}\n"
               "environment: {modules: [LUMI, aws-ofi-rccl/1.4]}\n"),
    ("lumi-g", "layouts: [{dp: 16}]\nresources: {account: project_465000000}\n"
               "environment: {modules: [lumi-aif-singularity-bindings]}\n"),
    ("frontier", "layouts: [{dp: 8}]\nresources: {account: A, extra_sbatch: ['-S 8']}\n"),
])
def test_what_the_site_allows_renders(system, body, tmp_path):
    manifest = render_sweep(load_sweep(_sweep(tmp_path, body, system=system)), tmp_path / "out")
    text = manifest.path(manifest.groups[0]["script"]).read_text()
    assert "#SBATCH --time=" in text
    if "-S 8" in body:
        assert "#SBATCH --core-spec=8\n" in text  # one word sbatch reads as -S 8


@pytest.mark.parametrize("given,expected", [
    ("-S 8", "--core-spec=8"), ("-S8", "--core-spec=8"), ("-C nvme", "--constraint=nvme"),
    ("-H", "--hold"), ("--exclusive", "--exclusive"), ("-Z 1", SpecError), ("-S", SpecError),
    ("-H now", SpecError),
])
def test_extra_sbatch_short_options_take_their_long_form(given, expected):
    from frontier_llm.jobs.sbatch_options import long_form

    if expected is SpecError:
        with pytest.raises(SpecError, match="extra_sbatch"):
            long_form(given)
    else:
        assert long_form(given) == expected


def test_master_port_stays_below_the_ephemeral_range():
    from frontier_llm.jobs import contract

    base = contract.DEFAULT_MASTER_PORT
    ports = {contract.master_port(base, job, slot, 4) for job in (0, 1, 12767, 10**7 + 3)
             for slot in range(4)}
    assert min(ports) >= base and max(ports) < contract.EPHEMERAL_LOW == 32768
    [(_, job)] = job_scripts(load_sweep(Path(__file__).parents[1] / "sweeps" / "tiny-cpu.yaml"),
                             Path("/tmp/flm-unused"))[:1]
    import dataclasses

    with pytest.raises(SpecError, match="below the ephemeral range"):
        render(dataclasses.replace(job, options={"master_port": "40000"}))


@pytest.mark.parametrize("body,message,source", RULES, ids=lambda v: str(v)[:30])
def test_each_site_rule_is_refused_with_its_source(body, message, source, tmp_path, monkeypatch):
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    sweep = load_sweep(_sweep(tmp_path, body))
    with pytest.raises(SpecError) as err:
        render_sweep(sweep, tmp_path / "out")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(message), text
    assert f"(source: {source}" in text
    assert not (tmp_path / "out").exists()


def test_lumi_partition_limits(tmp_path):
    sweep = load_sweep(_sweep(tmp_path, "layouts: [{dp: 320}]\n"
                              "resources: {partition: dev-g, account: project_1}\n",
                              system="lumi-g"))
    with pytest.raises(SpecError, match=r"^site rule lumi-g.queues: partition dev-g allows at "
                                        r"most 32 nodes; a job asks for 40 \(source: https://"
                                        r"docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/"
                                        r"partitions/"):
        render_sweep(sweep, tmp_path / "out")


def test_cli_refuses_in_one_line_and_takes_the_account_from_the_environment(tmp_path):
    path = _sweep(tmp_path, "layouts: [{dp: 8}]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FLM_ACCOUNT", "SBATCH_ACCOUNT")}
    cmd = [sys.executable, "-m", "frontier_llm.cli", "sweep", "render", str(path),
           "--out", str(tmp_path / "out")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "account_required" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run(cmd, env={**env, "FLM_ACCOUNT": "ABC123"}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    script = next((tmp_path / "out" / "scripts").glob("*.sh")).read_text()
    assert "#SBATCH --account=ABC123\n" in script


def test_sweep_overrides_site_keys_and_modules_absent_differs_from_empty(tmp_path):
    body = ("layouts: [{dp: 16}]\nresources: {account: A}\n"
            "site:\n  partition: extended\n"
            "  env: {NCCL_SOCKET_IFNAME: hsn0, FI_MR_CACHE_MONITOR: ''}\n")
    sweep = load_sweep(_sweep(tmp_path, body))
    [(_, job)] = job_scripts(sweep, tmp_path / "out")
    text = render(job)
    assert "#SBATCH --partition=extended\n" in text
    assert "export NCCL_SOCKET_IFNAME=hsn0\n" in text
    assert "FI_MR_CACHE_MONITOR" not in text
    assert "module load rocm/7.1.1\n" in text  # modules absent: the site's list
    empty = load_sweep(_sweep(tmp_path, body + "environment: {modules: []}\n", name="e.yaml"))
    [(_, job)] = job_scripts(empty, tmp_path / "out")
    assert "module load" not in render(job)


def test_unknown_site_key_names_the_line(tmp_path):
    path = _sweep(tmp_path, "layouts: [{dp: 1}]\nsite:\n  partiton: batch\n")
    with pytest.raises(SpecError, match=r"s.yaml:\d+: .*unknown site key 'partiton'"):
        load_sweep(path)


CUSTOM = """{% extends "frontier.sh.j2" %}
{% block system_env %}
{{ super() }}
export MY_CACHE={{ options.miopen_cache_root | q }}/mine
{% endblock %}
"""


def test_a_custom_template_extending_frontier_renders_from_the_sweeps_folder(tmp_path,
                                                                              monkeypatch):
    (tmp_path / "sweeps" / "tpl").mkdir(parents=True)
    (tmp_path / "sweeps" / "tpl" / "custom.sh.j2").write_text(CUSTOM)
    path = _sweep(tmp_path / "sweeps", "template: tpl/custom.sh.j2\nlayouts: [{dp: 8}]\n"
                  "resources: {account: A}\ntemplate_options: {miopen_cache_root: /dev/shm}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the template path resolves from the sweep file
    manifest = render_sweep(load_sweep(path), tmp_path / "out")
    text = manifest.path(manifest.groups[0]["script"]).read_text()
    assert "export MY_CACHE=/dev/shm/mine\n" in text
    assert "--gpu-bind=closest" in text and "MIOPEN_USER_DB_PATH=/dev/shm" in text
    bad = _sweep(tmp_path / "sweeps", "template: tpl/custom.sh.j2\nlayouts: [{dp: 8}]\n"
                 "template_options: {launcher: torchrun}\n", name="bad.yaml")
    with pytest.raises(SpecError, match=r"bad.yaml:\d+: unknown template option 'launcher' for "
                                        r"custom.sh.j2 \(valid: rccl_plugin_dir, "
                                        r"miopen_cache_root, stage_env, master_port\)"):
        load_sweep(bad)


@pytest.mark.parametrize("engine,tp,expected", [
    ("native", 2, ()),  # flm bench's engines do not overlap TP communication
    ("deepspeed", 2, ()),
    ("megatron", 2, (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)),  # --tp-comm-overlap
    ("megatron", 1, ()),  # no TP communication to overlap
])
def test_cuda_device_max_connections_only_where_tp_communication_overlaps(tmp_path, engine, tp,
                                                                          expected):
    import dataclasses

    from frontier_llm.jobs.sweepdir import _task_env

    sweep = load_sweep(_sweep(tmp_path, f"layouts: [{{tp: {tp}}}]\n", system="dgx-h100"))
    job = sweep.jobs[0]
    job = dataclasses.replace(job, layout=dataclasses.replace(job.layout, engine=engine))
    assert _task_env(sweep, job) == expected


@pytest.mark.parametrize("limit,signal", [("02:00:00", 300), ("00:05:00", 30)])
def test_frontier_signals_before_the_limit_at_most_a_tenth_of_it(tmp_path, limit, signal):
    """OLCF's --signal=B:USR1@300, but a 5-minute job told at once would stop before its first
    step: at most a tenth of the job's time."""
    sweep = load_sweep(_sweep(tmp_path, f"layouts: [{{dp: 8}}]\nresources: {{account: A, "
                                        f"time: '{limit}'}}\n"))
    [(_, job)] = job_scripts(sweep, tmp_path / "out")
    assert f"#SBATCH --signal=B:USR1@{signal}\n" in render(job)
