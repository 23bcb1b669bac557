"""The bench's single-process parts: layout refusals, mesh mapping, launcher detection, data,
optimizer, model pieces, memory limits and the command line (no process group needed)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from frontier_llm.bench import launch
from frontier_llm.bench.config import build_config, child_argv
from frontier_llm.bench.data import TokenSource, write_token_file
from frontier_llm.bench.memlimit import is_oom, parse_bytes
from frontier_llm.bench.mesh import check_layout, mesh_dims
from frontier_llm.bench.model import GPT, _RMSNormFn, build_model, loss_fn
from frontier_llm.bench.optim import LocalAdam
from frontier_llm.catalog import load_model
from frontier_llm.cli import build_parser
from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.parallel import ParallelConfig, zero_preset


def layout(**kw) -> ParallelConfig:
    kw.setdefault("global_batch", kw.get("dp", 1))
    return ParallelConfig(dtype="fp32", **kw)


# -- the sharding map -------------------------------------------------------------------------
@pytest.mark.parametrize("zero, kind, rep, shard, reshard", [
    (0, "ddp", 4, 1, False), (1, "zero1", 4, 1, False), (2, "fsdp", 1, 4, False),
    (3, "fsdp", 1, 4, True),
])
def test_zero_stages_map_to_pytorch(zero, kind, rep, shard, reshard):
    d = mesh_dims(layout(dp=4, sharding=zero_preset(zero)))
    assert (d.data_parallel, d.dp_replicate, d.dp_shard, d.reshard_after_forward) == (
        kind, rep, shard, reshard)


def test_partial_sharding_is_hsdp_over_a_2d_mesh():
    d = mesh_dims(layout(dp=8, sharding={"params": "partial:2", "grads": "partial:2",
                                         "optim": "partial:2"}))
    assert (d.data_parallel, d.dp_replicate, d.dp_shard) == ("hsdp", 4, 2)


def test_mesh_coordinates_put_tp_innermost():
    d = mesh_dims(layout(tp=2, pp=2, dp=2, global_batch=4))
    assert d.coords(1) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1,
                           "dp": 0, "ep": 0}
    assert d.coords(2)["dp"] == 1 and d.coords(4)["pp"] == 1
    assert all(d.rank_of(**{k: v for k, v in d.coords(r).items() if k != "dp"}) == r
               for r in range(8))


# -- refusals, before any process group ------------------------------------------------------
@pytest.mark.parametrize("model, kw, rule", [
    ("tiny-gpt", dict(tp=3), "heads .4. is not divisible by tp .3."),
    ("tiny-gpt", dict(pp=5, global_batch=5), "leaves a chunk without layers"),
    ("tiny-gpt", dict(pp=2, global_batch=2, engine="megatron"), "runs engine native only"),
    ("tiny-gpt", dict(dp=2, global_batch=2, engine="deepspeed", sharding={"params": "replicate",
                      "grads": "full", "optim": "full"}),
     "runs engine native only"),
    ("tiny-llama", dict(tp=4), r"kv_heads \(2\) < tp \(4\)"),
    ("tiny-gpt", dict(pp=2, global_batch=1), "at least one micro-batch per stage"),
    ("tiny-gpt", dict(dp=4, sharding={"params": "replicate", "grads": "replicate",
                                      "optim": "partial:2"}), "does not run sharding .* and HSDP"),
])
def test_bad_layouts_are_refused_with_the_rule(model, kw, rule):
    with pytest.raises(UserError, match=rule):
        check_layout(load_model(model), layout(**kw))


def test_world_size_must_match():
    with pytest.raises(UserError, match="does not match the 3 GPUs/ranks"):
        check_layout(load_model("tiny-gpt"), layout(tp=2, dp=2, global_batch=2), 3)


def test_fp16_is_refused():
    with pytest.raises(UserError, match="fp16 needs loss scaling"):
        check_layout(load_model("tiny-gpt"), ParallelConfig(dtype="fp16"))


# -- launcher detection -----------------------------------------------------------------------
def test_torchrun_environment():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
           "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}
    assert launch.detect(env) == launch.RankEnv(3, 4, 1, "n1", 1234, "torchrun", None)


def test_srun_step_environment_uses_the_node_list():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "nid[004-005]"}
    r = launch.detect(env)
    assert (r.rank, r.world_size, r.local_rank, r.master_addr, r.launcher, r.slurm_job_id) == (
        5, 8, 1, "nid004", "srun", "77")
    assert 20000 <= r.master_port < 40000


def test_batch_script_is_not_an_srun_step():
    # Inside sbatch's own shell SLURM_PROCID is set but there is no step: run alone (spawn).
    assert launch.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "9"}) is None


def test_mpiexec_environment_with_master():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MASTER_ADDR": "h0",
           "MASTER_PORT": "999"}
    assert launch.detect(env) == launch.RankEnv(2, 4, 2, "h0", 999, "mpiexec", None)


LAUNCHER_ENVS = json.loads((Path(__file__).parent / "data" / "launcher_envs.json").read_text())


@pytest.mark.parametrize("case, expected", [
    # case in tests/data/launcher_envs.json: (rank, world, local rank, launcher, slurm job)
    ("srun", (1, 2, 1, "srun", "1")),
    ("srun_pmi2", (1, 2, 1, "srun", "2")),  # srun's own PMI: PMI_* equal the step's
    # Hydra starts one proxy per node with srun: the ranks see a one-task step, SLURM_NTASKS=1.
    ("mpiexec_in_job", (1, 2, 1, "mpiexec", "1")),
    ("mpiexec_alone", (1, 2, 1, "mpiexec", None)),
    ("torchrun_in_srun", (1, 2, 1, "torchrun", "1")),
    ("deepspeed_alone", (1, 2, 1, "deepspeed", None)),
    ("deepspeed_in_srun", (1, 2, 1, "deepspeed", "3")),
    ("deepspeed_mpich_in_job", (1, 2, 1, "mpiexec", "3")),
    ("batch_shell", None),  # the batch script's own shell: no step, runs alone (spawns)
])
def test_detect_on_what_each_launcher_really_sets(case, expected, monkeypatch):
    """Environments captured from real launches (see tests/data/README.md). Where no
    MASTER_ADDR is given, MPI ranks ask mpi4py for rank 0's address: that broadcast needs a
    real MPI world, so here it answers a fixed pair (tests/test_bench_cli.py runs it for real)."""
    monkeypatch.setattr(launch, "_mpi_master", lambda rank: ("h0", 4242))
    r = launch.detect(LAUNCHER_ENVS[case]["env"])
    got = None if r is None else (r.rank, r.world_size, r.local_rank, r.launcher,
                                  r.slurm_job_id)
    assert got == expected


def test_open_mpi_inside_a_job_wins_over_its_daemon_step(monkeypatch):
    """Open MPI is not installed here: its variables (OMPI_COMM_WORLD_*, Open MPI's mpirun(1)
    man page) over the one-task step its prted daemon runs in, as Hydra's above."""
    monkeypatch.setattr(launch, "_mpi_master", lambda rank: ("h0", 4242))
    env = {**LAUNCHER_ENVS["mpiexec_in_job"]["env"], "OMPI_COMM_WORLD_RANK": "3",
           "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    for key in ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_EXTERNAL_LAUNCHER"):
        env.pop(key)
    assert launch.detect(env) == launch.RankEnv(3, 4, 3, "h0", 4242, "mpiexec", "1")


def test_nodelist_expansion():
    assert launch.expand_nodelist("nid[001-003,007],login1") == [
        "nid001", "nid002", "nid003", "nid007", "login1"]
    assert launch.expand_nodelist("a[1-2]b,c") == ["a1b", "a2b", "c"]


# -- data ---------------------------------------------------------------------------------------
def test_synthetic_batches_are_deterministic_and_sliced_by_dp():
    src = TokenSource(vocab=256, seq_len=32, seed=3)
    full = src.global_batch(5, 8)
    assert torch.equal(full, TokenSource(256, 32, 3).global_batch(5, 8))
    assert not torch.equal(full, src.global_batch(6, 8))
    x1, y1 = src.rank_batch(5, 8, dp=2, dp_rank=1)
    assert torch.equal(x1, full[4:, :-1]) and torch.equal(y1, full[4:, 1:])
    assert int(full.max()) < 256


def test_token_file_is_memory_mapped(tmp_path):
    tokens = np.arange(1000) % 250
    path = write_token_file(tmp_path / "t.bin", tokens, vocab=256)
    assert path.stat().st_size == 2000  # uint16
    batch = TokenSource(256, 32, seed=0, path=path).global_batch(0, 4)
    assert batch.shape == (4, 33)
    assert ((batch.diff(dim=1) % 250) == 1).all()  # contiguous windows of the file
    with pytest.raises(UserError, match="outside the model's vocabulary"):
        TokenSource(128, 32, seed=0, path=path).global_batch(0, 64)
    with pytest.raises(UserError, match="does not exist"):
        TokenSource(256, 32, seed=0, path=tmp_path / "missing.bin")


# -- optimizer and model ------------------------------------------------------------------------
def test_local_adam_is_torch_adam():
    a = torch.nn.Parameter(torch.randn(10, 3))
    b = torch.nn.Parameter(a.detach().clone())
    mine = LocalAdam([a], lr=1e-2)
    ref = torch.optim.Adam([b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        g = torch.randn(10, 3)
        a.grad, b.grad = g.clone(), g.clone()
        mine.step()
        ref.step()
    assert torch.equal(a, b)
    assert mine.state_bytes() == 2 * 4 * 30


def test_bf16_keeps_an_fp32_master_copy():
    p = torch.nn.Parameter(torch.randn(100).bfloat16())
    assert LocalAdam([p]).state_bytes() == 12 * 100  # master + exp_avg + exp_avg_sq


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "gpt3-1.3b", "llama3-8b",
                                  "tiny-llama@head_dim"])
def test_model_has_the_specs_parameter_count(name):
    if name.endswith("@head_dim"):  # Q and the output projection wider than hidden (Qwen3's way)
        spec = dataclasses.replace(load_model(name.split("@")[0]), name=name,
                                   head_dim=2 * load_model(name.split("@")[0]).head_dim)
    else:
        spec = load_model(name)
    with torch.device("meta"):
        model = GPT(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()


def test_stages_hold_their_layers_and_weights_match_the_whole_model():
    spec = load_model("tiny-gpt-8l")
    interleaved = Layout(pp=2, global_batch=4, schedule="interleaved", virtual_stages=2)
    assert interleaved.rank_chunks(1) == [1, 3]
    assert interleaved.chunk_layer_ids(spec, 3) == [6, 7]  # 4 chunks of 2
    three = Layout(pp=3, global_batch=3)
    assert [three.chunk_layer_ids(spec, g) for g in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    whole = dict(build_model(spec, seed=1).named_parameters())
    last = build_model(spec, seed=1, layer_ids=[6, 7], first=False, last=True)
    assert last.tok_embeddings is None
    for name, p in last.named_parameters():
        assert torch.equal(p, whole[name]), name


def test_rmsnorm_gradients():
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFn.apply(x, w, 1e-5), (x, w))
    ref = torch.nn.functional.rms_norm(x, (8,), w, 1e-5)
    assert torch.allclose(_RMSNormFn.apply(x, w, 1e-5), ref)


def _tiny_gpt_dropout():
    return dataclasses.replace(load_model("tiny-gpt"), name="tiny-gpt-dropout", dropout=0.1)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt-dropout"])
@pytest.mark.parametrize("recompute", ["selective", "full", "selective-op"])
def test_recompute_trains_like_no_recompute(recompute, model, flash):
    """Every recompute mode gives the losses and gradients of no recompute over three Adam
    steps, for SwiGLU without biases and for GeLU with biases and dropout: the checkpoint replays
    the random-number generator, so the recomputed dropout masks are forward's."""
    spec = _tiny_gpt_dropout() if model == "tiny-gpt-dropout" else load_model(model)
    data = torch.randint(0, spec.vocab, (3, 2, spec.seq_len + 1),
                         generator=torch.Generator().manual_seed(1))
    runs = []
    for rc in ("none", recompute):
        torch.manual_seed(0)
        m = build_model(spec, seed=0, recompute=rc, flash=flash)
        opt = LocalAdam(list(m.parameters()), lr=1e-3)
        losses, grads = [], None
        for x in data:
            loss = loss_fn(m(x[:, :-1]), x[:, 1:])
            loss.backward()
            losses.append(float(loss.detach()))
            grads = grads or [p.grad.clone() for p in m.parameters()]
            opt.step()
            opt.zero_grad()
        runs.append((losses, grads))
    (want, want_grads), (got, got_grads) = runs
    assert got == pytest.approx(want, rel=1e-6, abs=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-7)


# -- memory limit -------------------------------------------------------------------------------
def test_memory_sizes():
    assert parse_bytes("512M") == 512 * 2**20 and parse_bytes("1.5G") == int(1.5 * 2**30)
    assert parse_bytes("1000") == 1000
    with pytest.raises(UserError, match="--memory-limit"):
        parse_bytes("lots")


def test_oom_classification():
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ..."))
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_oom(RuntimeError("Connection closed by peer"))
    # The allocator's message cut short under a tight limit (seen in a SLURM fault test).
    assert is_oom(RuntimeError("[enforce fail a"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator"))
    assert not is_oom(RuntimeError("[enforce fail at ProcessGroupGloo.cpp:10] rank mismatch"))


# -- command line -------------------------------------------------------------------------------
def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_config_file_with_flag_overrides(tmp_path):
    cfg_file = tmp_path / "layout.yaml"
    cfg_file.write_text("model: tiny-gpt\nsteps: 3\nlayout:\n  tp: 2\n  pp: 2\n  zero: 1\n"
                        "  global_batch: 4\n  dtype: fp32\n")
    cfg = build_config(parse("--config", str(cfg_file), "--pp", "1", "--label", "sweep=s1"))
    lay = cfg.layout
    assert (lay.tp, lay.pp, lay.global_batch, lay.zero_stage, cfg.steps) == (2, 1, 4, 1, 3)
    assert cfg.labels == {"sweep": "s1"} and cfg.model.name == "tiny-gpt"


def test_child_command_line_round_trips():
    args = parse("--model", "tiny-gpt-8l", "--pp", "2", "--virtual-stages", "2",
                 "--global-batch", "4", "--sharding", "p=replicate,g=full,o=full", "--dp", "1",
                 "--sequence-parallel", "--tp", "2", "--memory-limit", "1G", "--dtype", "fp32",
                 "--recompute", "selective-op")
    cfg = build_config(args)
    cfg.run_id = "r1"
    again = build_config(parse(*child_argv(cfg, args)))
    assert again.layout == cfg.layout and again.memory_limit == 2**30
    assert again.layout.recompute == "selective-op"
    assert again.run_id == "r1" and again.model == cfg.model


def test_model_is_required():
    with pytest.raises(UserError, match="--model is required"):
        build_config(parse("--tp", "1"))


# -- the first error among the ranks ------------------------------------------------------------
GLOO_READ = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537]"
             " Read error [127.0.0.1]:33712: Connection reset by peer.")


def _reports(tmp_path, reports: dict[int, dict]):
    import types

    from frontier_llm.bench.run import _is_collateral, _status_path

    cfg = types.SimpleNamespace(trace_dir=str(tmp_path), run_id="r")
    for rank, (error, t) in reports.items():
        _status_path(cfg, rank).write_text(json.dumps({
            "status": "failed", "error": error, "time": t,
            "collateral": _is_collateral(RuntimeError(error))}))
    return cfg


def test_first_error_names_the_rank_that_failed_on_its_own(tmp_path):
    from frontier_llm.bench.run import _first_error

    cfg = _reports(tmp_path, {0: (GLOO_READ, 1.0), 1: ("ValueError: bad batch", 2.0)})
    assert _first_error(cfg, 2, None, wait_s=0)["error"] == "rank 1: ValueError: bad batch"


def test_first_error_names_a_silent_rank_before_the_echo(tmp_path):
    """A rank that died without a report (os._exit, a signal): rank 0's gloo error is only
    its echo, so the trace names the silent rank first."""
    from frontier_llm.bench.run import _first_error

    cfg = _reports(tmp_path, {0: (GLOO_READ, 1.0), 2: (GLOO_READ, 1.5)})
    assert _first_error(cfg, 3, None, wait_s=0)["error"] == (
        f"rank 1 left no report (crashed or hung?); rank 0: {GLOO_READ}")
    cfg = _reports(tmp_path, {1: (GLOO_READ, 1.2)})  # rank 1's echo arrives: no silent rank
    assert _first_error(cfg, 3, None, wait_s=0)["error"] == f"rank 0: {GLOO_READ}"


def test_the_launcher_finds_no_gpu_without_importing_torch(tmp_path):
    """Where no GPU device file exists the default system is cpu-local and torch stays
    unimported: ``flm bench``'s launcher paid seconds of CPU per run to learn it. A fresh
    interpreter, since this one imported torch above; the device files are named, so the test
    means the same on a machine with a GPU."""
    import subprocess
    import sys

    code = ("import sys; from frontier_llm.bench.config import default_system; "
            f"print(default_system(({str(tmp_path / 'nvidiactl')!r},)), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["cpu-local", "False"]
    # With a device file present it asks torch (whatever GPU torch then finds or not).
    (tmp_path / "nvidiactl").write_text("")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[1] == "True"


def test_a_rank_that_shards_nothing_never_imports_dtensor():
    """``torch.distributed.tensor`` costs each rank about 0.7 s of start-up; a layout with no
    tensor parallelism and no FSDP trains without it (bench/local_tensors.py). A fresh
    interpreter with a one-rank gloo group, since this one has it loaded."""
    import subprocess
    import sys

    def loaded(layout: str) -> tuple[str, str]:
        code = (
            "import sys, torch, torch.distributed as dist\n"
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{launch.free_port()}', "
            "rank=0, world_size=1)\n"
            "from frontier_llm.bench.engine import NativeEngine\n"
            "from frontier_llm.catalog import load_model\n"
            "from frontier_llm.specs.layout import Layout\n"
            f"e = NativeEngine(load_model('tiny-gpt'), {layout}, rank=0, world_size=1, "
            "device=torch.device('cpu'))\n"
            "loss = e.step(0)\n"
            "dist.destroy_process_group()\n"
            "print(loss > 0, 'torch.distributed.tensor' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert out.returncode == 0, out.stderr[-3000:]
        return tuple(out.stdout.split())

    assert loaded("Layout(global_batch=2, micro_batch=1)") == ("True", "False")


def test_a_head_dim_apart_trains_and_mla_is_refused_before_any_rank_starts():
    """flm bench builds Q and the output projection heads x head_dim wide (Qwen3's and
    gpt-oss's way): one forward and backward on CPU give a finite loss and a gradient on every
    weight. Multi-head latent attention it does not build: refused when the config is read."""
    spec = dataclasses.replace(load_model("tiny-llama"), name="tiny-llama-wide-heads",
                               head_dim=32)
    torch.manual_seed(0)
    model = GPT(spec)
    attention = next(iter(model.layers.values())).attention
    assert attention.wq.weight.shape == (128, 64) and attention.wo.weight.shape == (64, 128)
    logits = model(torch.randint(0, spec.vocab, (2, spec.seq_len)))
    assert logits.shape == (2, spec.seq_len, spec.vocab)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                             torch.randint(0, spec.vocab, (2 * spec.seq_len,)))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(UserError, match="no multi-head latent attention: deepseek-v3"):
        build_config(parse("--model", "deepseek-v3"))
