"""flm calibrate: measure a system's matrix and collective performance and fit the cost model's
parameters to it.

Stages, each a module with one job:

- :mod:`.shapes` — the GEMM shapes a model's layouts produce per tensor-parallel degree;
- :mod:`.microbench` — runs inside every rank: times those GEMMs and the collectives
  (``torch.distributed``: gloo, NCCL or RCCL; an MPI baseline through ``mpi4py``) and writes one
  results JSON file with provenance (rank 0);
- :mod:`.local` — starts the microbenchmark's ranks on this machine (``mpiexec`` or plain
  processes); :mod:`.submit` renders and submits it as a SLURM job from a job template;
- :mod:`.results` — reads a results file into DataFrames and checks it;
- :mod:`.fit` — alpha-beta per link tier (with residuals) and the achievable matrix rate with its
  size effect, pure functions on DataFrames;
- :mod:`.system_file` — writes the fitted figures as a system YAML (with provenance) that
  ``flm plan --system FILE`` loads unchanged;
- :mod:`.fromruns` — the closed loop: refits the cost model's efficiency knobs from measured runs
  in the store and reports the error before and after on held-out runs (k-fold).

Saving and reading these results in the store: :mod:`frontier_llm.store.calibration_tables`.
Documentation: docs/calibrate.md.
"""
