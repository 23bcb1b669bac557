"""The first rendezvous has its own bound, apart from the hang bound of a collective: at 75,264
ranks the hang bound is 426 s, and ranks importing from Lustre may arrive minutes apart, so a
healthy job whose last rank was slow to start died at init_process_group. Real flm bench ranks
over gloo, started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), the second one
later than the collective timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from frontier_llm.bench.launch import _ephemeral_range, free_port
from frontier_llm.bench.placement import collective_timeout_s, rendezvous_timeout_s
from frontier_llm.child import flm


def test_a_local_run_meets_on_a_free_port_no_outgoing_connection_can_take():
    """The port is listenable now and below the kernel's ephemeral range, where an outgoing
    connection of another run (the suite's other worker, a gloo mesh) could take it between
    this choice and rank 0's listen."""
    ephemeral = _ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert all(p not in ephemeral for p in ports)
    assert len(ports) > 1  # chosen at random: two runs started together rarely collide
    with socket.socket() as held:  # one that is listened on is never handed out
        held.bind(("", min(ports)))
        held.listen()
        assert min(ports) not in {free_port() for _ in range(200)}


def test_a_rank_later_than_the_hang_bound_still_joins(tmp_path):
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_"))}
    base.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                TORCHELASTIC_RUN_ID="rdv", OMP_NUM_THREADS="1",
                FLM_COLLECTIVE_TIMEOUT="4", FLM_RENDEZVOUS_TIMEOUT="120")
    argv = flm(["bench", "--model", "tiny-gpt", "--dtype", "fp32", "--dp", "2", "--steps", "1",
                "--warmup", "0", "--global-batch", "2", "--trace-dir", str(tmp_path)])
    procs = []
    for rank in (0, 1):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
        if rank == 0:
            time.sleep(12)  # three times the collective timeout: rank 1 is slow to start
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs


def test_the_rendezvous_bound_is_apart_from_the_hang_bound():
    """Without settings: at least the collective timeout, and at a full Frontier job long
    enough for a start-up from Lustre (walltime.startup_s: 204 s at 9,408 nodes) several times
    over, where the hang bound is 426 s."""
    ranks = 75_264
    assert int(collective_timeout_s(ranks, {})) == 425  # the docs round it to 426 s
    assert rendezvous_timeout_s(ranks, {}) >= 1800 > collective_timeout_s(ranks, {})
    assert rendezvous_timeout_s(8, {"FLM_RENDEZVOUS_TIMEOUT": "90"}) == 90
