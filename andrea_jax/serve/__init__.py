"""Using a trained model: loading a run or an export, generation with a KV cache, scoring,
evaluation, export to Hugging Face, and the lm-eval adapter."""
