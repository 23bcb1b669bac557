"""The plain-tensor tensor-parallel layers (bench/tp_layers.py, what the deepspeed engine uses
under pipelines) compute the whole model's loss and gradients: 2 real gloo ranks, one batch,
GPT (biases, learned positions) and Llama (GQA, SwiGLU), with a vocabulary tp does not divide
(255: the last rank's padding row is never looked up and gets no gradient)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier_llm.bench.launch import free_port
from frontier_llm.catalog import load_model
from frontier_llm.costmodel.params import stage_params_per_rank

REPO = Path(__file__).resolve().parents[1]
WORLD = 2


MODELS = ["tiny-gpt", "tiny-llama"]


def test_split_model_gives_the_whole_models_loss_and_gradients(tmp_path):
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
               WORLD_SIZE=str(WORLD),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "tp_layers_ranks.py"),
                               str(tmp_path), ",".join(MODELS), "255"], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, logs[0][-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for model in MODELS:
        spec = dataclasses.replace(load_model(model), vocab=255)
        for r in (rank[model] for rank in ranks):
            assert r["got"] == pytest.approx(r["want"], rel=1e-6), model
            assert r["grad_diff"] < 1e-6, (model, r)
            assert r["padding_grad"] == 0.0
            # What each rank holds is the cost model's tensor-parallel count (ceil(V/tp) rows).
            assert r["held"] == stage_params_per_rank(spec, WORLD, 1, 0)
