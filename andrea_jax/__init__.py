"""ANDREA-JAX: pretrain ANDREA-120M with ProRes in JAX/Flax (README.md; the layout: docs/ARCHITECTURE.md).

Importing the package, or any module that does not itself need jax (config, errors, workdir),
imports no jax, changes no environment variable and redirects no file descriptor: what a command
needs before jax starts is done by the command (andrea_jax/startup.py).
"""
