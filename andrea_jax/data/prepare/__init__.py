"""The offline preparation of a corpus, run once before training (`andrea-prepare`,
`python -m andrea_jax.data.prepare`): driver.py parses the command and plans, corpus_units.py cuts the
corpus into units and shards, pipelines.py holds the Apache Beam pipelines, dask_cluster.py the Dask
cluster of `--runner dask`. Training never imports this package; it reads what it wrote through
andrea_jax.data.token_shards.
"""
