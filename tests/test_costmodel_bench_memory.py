"""The memory terms against measured peaks: real `flm bench` runs with FSDP (ZeRO-3, dp = 2, gloo
on CPU).

On a CPU the bench has no allocator peak, only each process's peak resident set, which also holds
torch itself (about 270 MB, the same in every run). Two runs that differ only in the vocabulary
cancel that out: the difference of their peak RSS is what the vocabulary-sized terms cost —
the rank's shards of the embeddings and head with their optimizer states, the saved fp32
log-probabilities and the two fp32 sequence × vocabulary temporaries of the cross-entropy
backward, which runs with every unit resharded (flm bench reshards FSDP's root after forward
too; flm memcheck measures it: tests/test_memcheck_grid.py). The cost model's predicted peaks
must differ by the same amount (within 15 %; 451 MB predicted for 482 MB measured in one run), and
the model-states-plus-saved-activations sum the bench reports on CPU must not (it misses the
gathered copies and the loss temporaries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHAPE = "layers: 2\nhidden: 64\nheads: 4\nseq_len: 128\n"


def _bench(tmp_path: Path, vocab: int) -> dict:
    spec = tmp_path / f"v{vocab}.yaml"
    spec.write_text(f"name: v{vocab}\n{SHAPE}vocab: {vocab}\n")
    cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", str(spec), "--dp", "2",
           "--zero", "3", "--micro-batch", "4", "--global-batch", "8", "--dtype", "fp32",
           "--steps", "1", "--warmup", "0", "--trace-dir", str(tmp_path), "--run-id",
           f"v{vocab}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"v{vocab}.trace.json").read_text())


@pytest.mark.slow
def test_fsdp_peak_memory_terms_match_measured_rss(tmp_path):
    big, small = _bench(tmp_path, 65536), _bench(tmp_path, 256)

    def rss(trace):
        return sum(r["host_rss_peak_bytes"] for r in trace["memory"]) / len(trace["memory"])

    def predicted(trace):
        return trace["prediction"]["peak_memory_bytes"]

    def states_and_activations(trace):
        parts = trace["prediction"]["breakdown"]["memory_bytes"]
        return sum(parts[k] for k in ("params", "grads", "optimizer", "activations"))

    measured = rss(big) - rss(small)
    model = predicted(big) - predicted(small)
    old = states_and_activations(big) - states_and_activations(small)
    assert measured > 300e6  # the vocabulary dominates: the comparison means something
    print(f"measured {measured / 1e6:.0f} MB, predicted {model / 1e6:.0f} MB, "
          f"states + activations {old / 1e6:.0f} MB")
    assert model == pytest.approx(measured, rel=0.15), (model, measured)
    assert abs(old - measured) > 0.3 * measured, (old, measured)
    parts = big["prediction"]["breakdown"]["memory_bytes"]
    # The loss's backward is the peak: its temporaries, and no gathered copy (all resharded).
    assert parts["loss"] > 0 and parts["buffers"] == 0
