"""Fixtures shared by several test modules, and one XLA compilation cache for the whole suite."""
import dataclasses
import os
import subprocess
import sys
import tempfile

# Many tests compile the same small programs, in this process and in the train.py processes they
# start (a resumed run compiles what the straight run did). One persistent cache, shared through
# the environment with every worker and child process, compiles each once. Keys hold the HLO, the
# compile options and the jax version: a hit is the same executable. The cache is unbounded: a size
# bound makes jax scan the whole folder, thousands of entries, under a file lock at every write.
# Without the lock a read that races a write of the same entry fails to decompress, and jax then
# warns and compiles it.
_XLA_CACHE = {"JAX_COMPILATION_CACHE_DIR": os.path.join(tempfile.gettempdir(), f"andrea_jax_tests_xla_{os.getuid()}"),
              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
              "JAX_COMPILATION_CACHE_MAX_SIZE": "-1"}
for _key, _value in _XLA_CACHE.items():
    os.environ.setdefault(_key, _value)
# Compiles for a GPU that is not here (andrea_jax.aot) cannot use that cache; XLA:GPU's kernel cache keeps
# their kernels instead. One folder per xdist worker: XLA rewrites the file whole, unlocked, so two
# processes compiling at once could read each other's half-written file.
os.environ.setdefault("ANDREA_GPU_KERNEL_CACHE", os.path.join(
    os.environ["JAX_COMPILATION_CACHE_DIR"], "gpu_kernels", os.environ.get("PYTEST_XDIST_WORKER", "main")))
# Compiling is most of the suite's time, so its programs compile cheaply: LLVM at -O0 instead of -O2, and
# XLA:CPU's elemental emitters instead of its MLIR fusion emitters (fewer, larger fusions). With those
# emitters a toy train step compiles five to seven times faster at -O0 than at -O2, and the suite's first
# run takes a third less time than at -O1, its next a twentieth more (-O0's code runs slower). Tests marked
# `compiled_at_o1` run in a pytest process of their own at -O1 (pytest_pyfunc_call below). Processes
# started with a level of their own in XLA_FLAGS keep it.
_LEVEL = "--xla_backend_optimization_level"
_CHEAP_COMPILES = f"{_LEVEL}=0 --xla_cpu_use_fusion_emitters=false"
if _LEVEL not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_CHEAP_COMPILES}".strip()
# The suite runs on the CPU, in every process it starts (the CUDA plugin of the test extra's
# gpu-compile packages serves andrea_jax.aot's deviceless compiles, not computation).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from andrea_jax import startup  # noqa: E402

startup.start_jax()  # as every command does: the CUDA plugin's lines on a machine without a driver dropped

from andrea_jax.data import pipeline, tokenizer as tok_lib  # noqa: E402

_AT_O1 = ("compiled_at_o1: the test's bounds are -O1's rounding, or it runs far more than it compiles; where the "
          "suite compiles at -O0 it runs in a pytest process of its own at -O1")
_O1_PROCESS = "ANDREA_TESTS_O1_PROCESS"


def pytest_configure(config):
    config.addinivalue_line("markers", _AT_O1)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A `compiled_at_o1` test, in a process compiling at -O0, is run again alone by a pytest at -O1 and
    takes that run's outcome."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    marked = pyfuncitem.get_closest_marker("compiled_at_o1") is not None
    if not marked or f"{_LEVEL}=0" not in flags or os.environ.get(_O1_PROCESS):
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["XLA_FLAGS"] = " ".join([*(f for f in flags if not f.startswith(_LEVEL)), f"{_LEVEL}=1"])
    env[_O1_PROCESS] = "1"  # it runs the test itself, whatever its flags
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                          cwd=pyfuncitem.config.rootpath, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"at -O1, in a pytest of its own (exit {proc.returncode}):\n{proc.stdout[-8000:]}"
                    f"{proc.stderr[-2000:]}", pytrace=False)
    return True


@pytest.fixture
def empty_temporary_folder(tmp_path, monkeypatch):
    """An empty folder made the temporary folder (TMPDIR and tempfile's) of this process and of those
    it starts, for checking what a command leaves there."""
    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory):
    """A small tokenizer (300 tokens) trained once, so most tests need not train their own."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok_lib.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:100_000]], 300).save(str(path))
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tok_path):
    """make(*overrides, steps=6) -> the workdir of a short run of a 3-block toy on the embedded
    corpus, checkpointed every 3 steps; with prores.warmup=4 its alphas at step 6 are
    [1, 0.75, 0.5] (mid-warmup). Runs are cached per arguments within a test process."""
    from andrea_jax import cli, config as config_lib, configs
    from andrea_jax.train import loop as trainer

    made = {}

    def make(*overrides, steps=6):
        key = (overrides, steps)
        if key not in made:
            workdir = tmp_path_factory.mktemp("run")
            cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
                f"train.steps={steps}", "train.checkpoint_every=3", "train.eval_every=0",
                "train.sample_tokens=0", "train.batch_size=4", "model.n_layer=3", "model.d_model=32",
                "model.n_head=4", "model.seq_len=32", "model.vocab_size=300", "prores.schedule=linear",
                "prores.warmup=4",
                f"data.tokenizer={tok_path}", "diagnostics.tensorboard=false", *overrides]))
            saved_cache = os.environ.get("ANDREA_CACHE")
            os.environ["ANDREA_CACHE"] = str(tmp_path_factory.mktemp("cache"))  # its own token cache
            try:
                trainer.train(cfg, workdir, show_progress=False, extra_hooks=cli.training_hooks(cfg))
            finally:
                if saved_cache is None:
                    os.environ.pop("ANDREA_CACHE")
                else:
                    os.environ["ANDREA_CACHE"] = saved_cache
            made[key] = workdir
        return made[key]

    return make


@pytest.fixture(scope="session")
def embedded_corpus_cache(tmp_path_factory, tok_path):
    """An ANDREA_CACHE holding what most runs build first from the embedded corpus, built once per
    test process: its TFDS dataset, and the tokenizer and token file of `tiny`'s vocabulary (8449),
    of 300 tokens, and of tok_path."""
    from andrea_jax import configs

    cache = tmp_path_factory.mktemp("embedded_corpus_cache")
    data = configs.load("tiny").data
    for data_cfg, vocab_size in ((data, 8449), (data, 300), (dataclasses.replace(data, tokenizer=str(tok_path)), 300)):
        pipeline.tokenized_corpus(data_cfg, vocab_size=vocab_size, seq_len=16, cache_dir=cache)
    return cache


@pytest.fixture(autouse=True)
def own_andrea_cache(request, tmp_path_factory, monkeypatch):
    """Every test (and every process it starts) gets its own ANDREA_CACHE: no test reads a file another
    test or an earlier session wrote. In a parallel session (pytest -n, the README's) it starts with
    hard links to the files of embedded_corpus_cache, which pays for itself over hundreds of tests but
    not for a test or a file run alone; the pipeline never writes a cache file in place (it writes a
    new one and renames it), so a link is never changed."""
    cache = tmp_path_factory.mktemp("andrea_cache")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        built = request.getfixturevalue("embedded_corpus_cache")
        for path in built.rglob("*"):
            if path.is_file() and path.name != "build.lock":
                target = cache / path.relative_to(built)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, target)
    monkeypatch.setenv("ANDREA_CACHE", str(cache))
