"""The ProRes reproduction on a CPU: experiment definitions, a resumable parallel runner, paired
statistics, figures and the report (`scripts/reproduce_prores.py` wires them together)."""
