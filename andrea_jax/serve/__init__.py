"""Using a trained model: loading a run or an export, generation with a KV cache, scoring,
evaluation, export to Hugging Face, and the lm-eval adapter.

Importing this package starts nothing. A command module run as `python -m andrea_jax.serve.NAME`
starts jax itself, as its console script does (andrea_jax/commands.py): a guard at its top, above
the imports that import jax."""
