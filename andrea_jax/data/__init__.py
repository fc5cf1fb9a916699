"""Input: the tokenizer, corpus sources and the grain pipeline. Knows nothing of the model."""
