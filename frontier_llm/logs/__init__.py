"""Training logs of other trainers (Megatron-LM / Megatron-DeepSpeed, torchtitan, DeepSpeed)
read into flm traces: ``flm collect --from-logs`` (docs/trainer-logs.md).

Each trainer's reader is its own (``trainers/*_log.py``, ``Trainer.log_reader``); this package
keeps what is no trainer's: the trace a parsed run becomes (``traces.py``) and the sweep job's
wrapper (``job.py``).
"""
