"""flm tune: Optuna studies over layouts and run settings, whose trials are real jobs.

    spec          the study: section of a sweep file (space, objective, budget, sampler, seed)
    space         the space as Optuna parameters, each point with the cost model's verdict
    optuna_study  storage in the results database, samplers, proposals (model in the loop)
    driver        collect, tell, ask, submit: one idempotent step, or a loop
    lock          one driver per study at a time (flock on SQLite, advisory lock on PostgreSQL)
    local         the local executor, detached (a step does not wait for its jobs)
    report        status and the winner, read back from the study
    replay        a study against a table of past measurements (tests, benchmarks)

docs/tune.md is the user's guide.
"""
