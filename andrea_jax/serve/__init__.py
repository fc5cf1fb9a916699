"""Using a trained model: loading a run or an export, generation with a KV cache, scoring,
evaluation, export to Hugging Face, and the lm-eval adapter."""
import sys

from andrea_jax import startup

# `python -m andrea_jax.serve.NAME` imports this package while it locates NAME (sys.argv[0] is "-m"
# until then), before NAME imports jax at its top: jax starts here as the console scripts start it
# (andrea_jax/commands.py), quietly where the CUDA plugin has no driver. An import from Python
# starts nothing.
if sys.argv[:1] == ["-m"]:
    startup.start_jax()
