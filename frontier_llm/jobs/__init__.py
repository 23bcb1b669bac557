"""Sweeps as jobs: render batch scripts, submit to SLURM or run locally, classify what happened.

    sweepspec   sweep YAML files -> validated Sweep with one SweepJob per layout
    render      JobScript -> batch script text (pure; every value shell-quoted)
    launchers   srun / torchrun / mpiexec launch lines from the site's launcher and binding
    site_policy the site's rules (time bins, queues, cores, account), checked before writing
    sweepdir    a sweep's folder: grouped array scripts, manifest, logs, traces
    slurm       sbatch/squeue/sacct/scontrol/scancel through argument lists, batched polls
    executors   slurm and local executors behind one interface
    classify    COMPLETED / OOM / TIMEOUT / NODE_FAIL / CANCELLED / FAILED / HUNG
    state       job rows in the store's flm_jobs table (crash-safe submit)
    runner      submit, refresh, cancel, retry (what `flm sweep` does)

docs/sweeps.md is the user's guide; docs/sites.md what each site requires.
"""
