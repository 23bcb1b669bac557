"""The distributed GPT training benchmark that runs inside each job and writes a trace."""
