"""A Python whose import system refuses chosen packages, as a machine without them would.

`refusing_env(folder, names)` writes a sitecustomize.py into `folder` that sets
sys.modules[name] = None for each name (so `import name` raises ModuleNotFoundError and
importlib.util.find_spec(name) returns None), and returns an environment that puts it first.
"""
import os
import pathlib

# Every optional dependency: what a plain `pip install -e .` does not bring.
OPTIONAL = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda12_pjrt", "jax_triton", "triton", "torch",
            "transformers", "lm_eval", "apache_beam", "dask", "distributed", "wandb", "gcsfs")


def refusing_env(folder: pathlib.Path, names=OPTIONAL, env=None) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names))
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])
    return env
