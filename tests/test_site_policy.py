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
                                        r"miopen_cache_root, master_port\)"):
        load_sweep(bad)
