"""`python -m andrea_jax.data.prepare --runner dask`: on a real Dask scheduler and two worker
processes on 127.0.0.1, the output is the DirectRunner's byte for byte (every shard, index, marker
less its timing, TFDS metadata, manifest and tokenizer), with a given tokenizer and with one it
trains; an empty corpus is reported (Beam's Top.Smallest lost the sample on Dask); each pipeline
ends in one transform that needs all of its work (Dask computes only that one); a scheduler that
cannot run the job is refused in one line."""
import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import apache_beam as beam
import distributed  # noqa: F401  a test dependency (the `test` extra has apache-beam[dask]): never skipped
import portpicker
import pytest

from _corpus import PARAGRAPHS, run_prepare, write_corpus
from andrea_jax.data.prepare import dask_cluster, driver as prepare, pipelines


def _stop(procs):
    """SIGTERM, then SIGKILL after 3 s: a Dask worker can wait long for its scheduler to answer."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 3
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def dask_cluster_processes(logs: pathlib.Path, workers: int = 2):
    """(tcp://127.0.0.1:PORT, {name: process}) of a `dask scheduler` and `workers` `dask worker`
    processes (one thread each, no nanny: a killed worker stays dead), stopped at exit."""
    logs.mkdir(parents=True, exist_ok=True)
    port = portpicker.pick_unused_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = {}

    def start(name, *argv):
        with open(logs / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT,
                                           env=dict(os.environ, RAYON_NUM_THREADS="1"))

    try:
        start("scheduler", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
              "--no-dashboard")
        for w in range(workers):
            start(f"worker{w}", "distributed.cli.dask_worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                  "--no-nanny", "--no-dashboard", "--name", f"worker{w}")
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=60)
        yield address, procs
    except Exception:
        print("\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.iterdir())))
        raise
    finally:
        _stop(list(procs.values()))


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The address of a scheduler with two worker processes, for the module's tests."""
    with dask_cluster_processes(tmp_path_factory.mktemp("dask_logs")) as (address, _):
        yield address


def contents(out: pathlib.Path) -> dict:
    """Every file of a prepared folder: its bytes; a marker's JSON less its timing (`made`)."""
    found = {}
    for p in sorted(out.iterdir()):
        if p.name.endswith(".done.json"):
            marker = json.loads(p.read_text())
            assert set(marker["made"]) == {"seconds", "cpu_seconds", "started", "finished", "pid"}
            found[p.name] = {k: v for k, v in marker.items() if k != "made"}
        else:
            found[p.name] = p.read_bytes()
    return found


@pytest.mark.parametrize("tokenizer", ["given", "trained"])
def test_dask_output_is_the_direct_runners_byte_for_byte(tokenizer, scheduler, tmp_path, tok_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    extra = ["--tokenizer", str(tok_path)] if tokenizer == "given" else ["--vocab-size", "300",
                                                                         "--tokenizer-docs", "150"]
    assert run_prepare(corpus, tmp_path / "direct", *extra) == 0, capsys.readouterr().err
    assert run_prepare(corpus, tmp_path / "dask", *extra, "--runner", "dask", "--scheduler", scheduler,
                       workers=2) == 0, \
        capsys.readouterr().err
    assert '"shards_tokenized": 3' in capsys.readouterr().out
    want, got = contents(tmp_path / "direct"), contents(tmp_path / "dask")
    assert sorted(got) == sorted(want)
    assert len([n for n in got if n.startswith("andrea_tokens-train.array_record-")]) == 3 * 3   # shard, index, marker
    for name in want:
        assert got[name] == want[name], name
    # The work was spread: the shards were tokenized by both workers (their pids in the markers).
    pids = {json.loads(p.read_text())["made"]["pid"] for p in (tmp_path / "dask").glob("*.done.json")}
    assert len(pids) == 2 and os.getpid() not in pids


def test_local_dask_cluster_and_an_empty_corpus_without_tokenizer(tmp_path, tok_path, capsys, empty_temporary_folder):
    """No --scheduler: a local cluster of --workers processes, which leaves nothing in the temporary
    folder. A corpus without documents is reported as such, and only such a corpus (on Dask,
    Top.Smallest's output is lost, which must not read as an empty corpus)."""
    corpus = write_corpus(tmp_path / "corpus", n_files=2)
    assert run_prepare(corpus, tmp_path / "direct", "--tokenizer", str(tok_path), shards=2) == 0
    assert run_prepare(corpus, tmp_path / "dask", "--tokenizer", str(tok_path), "--runner", "dask", shards=2,
                       workers=2) == 0, \
        capsys.readouterr().err
    assert not list(empty_temporary_folder.iterdir())
    assert contents(tmp_path / "dask") == contents(tmp_path / "direct")
    capsys.readouterr()

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text('{"text": "  "}\n\n')
    assert run_prepare(tmp_path / "empty", tmp_path / "out_empty", "--runner", "dask", shards=1, workers=1) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        f"error: corpus {tmp_path}/empty/a.jsonl is empty"], err


def _plan(tmp_path, shards=3):
    return {"out": str(tmp_path), "shards": shards, "units": [("files", "a.txt"), ("files", "b.txt")], "name": "c",
            "source_key": "k", "assignment": [[0], [1], []][:shards]}


def test_each_pipeline_ends_in_one_transform_that_needs_all_its_work(tmp_path):
    """The Dask runner computes only the graph's last transform: everything else must lead to it."""
    for graph in (lambda p: pipelines.tokenizer_graph(p, _plan(tmp_path), 0, 10, 300),
                  lambda p: pipelines.shards_graph(p, _plan(tmp_path), "h", 300)):
        p = beam.Pipeline()
        graph(p)
        assert pipelines.ends_in_one_sink(p) == []
    # The check sees a branch that the last transform does not need.
    p = beam.Pipeline()
    _ = p | "Dangling" >> beam.Create([1]) | "Lost" >> beam.Map(print)
    pipelines.shards_graph(p, _plan(tmp_path), "h", 300)
    skipped = pipelines.ends_in_one_sink(p)
    assert "Lost" in skipped and all(label == "Lost" or label.startswith("Dangling/") for label in skipped), skipped


def test_a_scheduler_that_cannot_run_the_job_is_one_line(scheduler, tmp_path, tok_path, capsys, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus", n_files=1)
    port = portpicker.pick_unused_port()   # nothing listens there
    start = time.perf_counter()
    with pytest.raises(prepare.DataError, match=rf"^--scheduler tcp://127.0.0.1:{port}: no Dask scheduler answered"):
        dask_cluster.check(f"tcp://127.0.0.1:{port}", timeout_s=3)
    assert time.perf_counter() - start < 30
    # Workers without the package: checked by its distribution's name before any task is sent.
    monkeypatch.setattr(dask_cluster, "PACKAGE", "andrea-jax-not-installed")
    assert run_prepare(corpus, tmp_path / "out", "--tokenizer", str(tok_path), "--runner", "dask",
               "--scheduler", scheduler) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    assert re.fullmatch(rf"error: --scheduler {scheduler}: 2 worker\(s\) \(tcp://127.0.0.1:\d+, tcp://127.0.0.1:\d+\) "
                        r"do not have andrea-jax-not-installed installed: install it \(pip install "
                        r"andrea-jax-not-installed\[dask\]\) where the workers run", lines[0]), lines[0]


def _prepare_process(corpus, out, shards, *extra):
    """`python -m andrea_jax.data.prepare` in its own process (so that it can be killed)."""
    return subprocess.Popen([sys.executable, "-m", "andrea_jax.data.prepare", "--source", "files", "--path",
                             str(corpus), "--out", str(out), "--shards", str(shards), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RAYON_NUM_THREADS="1"))


def _first_marker(out, proc, timeout_s=90):
    """Waits (bounded) until a shard of `out` is complete; returns how many are."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = len(list(out.glob("*.done.json"))) if out.is_dir() else 0
        if done:
            return done
        assert proc.poll() is None, f"prepare ended before any shard was complete: {proc.communicate()}"
        time.sleep(0.02)
    raise AssertionError(f"no shard of {out} complete in {timeout_s} s")


SHARDS = 4   # of the corpus a worker is killed in the middle of


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory, tok_path):
    """(a corpus whose shards take long enough to be killed in the middle of, the DirectRunner's
    output on it in SHARDS shards)."""
    folder = tmp_path_factory.mktemp("long")
    corpus = folder / "corpus"
    corpus.mkdir()
    for f in range(SHARDS):   # ~0.25 MB each
        (corpus / f"part{f}.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in PARAGRAPHS) * 4)
    assert run_prepare(corpus, folder / "direct", "--tokenizer", str(tok_path), shards=SHARDS) == 0
    return corpus, contents(folder / "direct")


def test_a_worker_killed_mid_run_leaves_the_uninterrupted_output(long_corpus, tmp_path, tok_path):
    """Dask gives the killed worker's tasks to the other one (a shard found complete by its marker
    is not rewritten), and its half-written file is removed at the end."""
    corpus, want = long_corpus
    with dask_cluster_processes(tmp_path / "logs") as (address, procs):
        out = tmp_path / "out"
        proc = _prepare_process(corpus, out, SHARDS, "--tokenizer", str(tok_path), "--runner", "dask",
                                "--scheduler", address)
        done_at_kill = _first_marker(out, proc)
        procs["worker0"].kill()
        stdout, stderr = proc.communicate(timeout=120)
    assert done_at_kill < SHARDS and proc.returncode == 0, stderr
    assert contents(out) == want


def test_a_rerun_after_a_lost_cluster_redoes_exactly_the_unfinished_shards(long_corpus, tmp_path, tok_path,
                                                                            capsys):
    corpus, want = long_corpus
    with dask_cluster_processes(tmp_path / "logs") as (address, procs):
        out = tmp_path / "out"
        proc = _prepare_process(corpus, out, SHARDS, "--tokenizer", str(tok_path), "--runner", "dask",
                                "--scheduler", address)
        _first_marker(out, proc)
        for p in (proc, *procs.values()):   # the driver and the whole cluster: nothing writes any more
            p.kill()
        proc.communicate(timeout=30)
    done = {p.name[:-len(".done.json")] for p in out.glob("*.done.json")}
    assert 1 <= len(done) < SHARDS
    before = {name: (out / name).stat().st_mtime_ns for name in done}
    # The rerun (on a local cluster) redoes exactly the shards without a marker.
    assert run_prepare(corpus, out, "--tokenizer", str(tok_path), "--runner", "dask", shards=SHARDS,
                       workers=2) == 0, \
        capsys.readouterr().err
    assert f'"shards_tokenized": {SHARDS - len(done)}' in capsys.readouterr().out
    assert {name: (out / name).stat().st_mtime_ns for name in done} == before
    assert contents(out) == want
