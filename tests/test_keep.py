"""scripts/sweeps/keep.sh: what a sweep's next sitting on another machine needs, and nothing more."""
import pathlib
import subprocess
import tarfile

KEEP = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "sweeps" / "keep.sh"


def test_keep_packs_finished_runs_without_checkpoints_or_unfinished_runs(tmp_path):
    runs = tmp_path / "runs"
    (runs / "code" / "andrea_jax").mkdir(parents=True)
    (runs / "code" / "SOURCE.txt").write_text("git archive abc\n")
    group, rung = runs / "grid", runs / "ladder" / "d32"  # a sweep's group; a ladder's, one level deeper
    for run, finished in ((group / "a_s0", True), (group / "b_s0", False), (rung / "c_s0", True)):
        (run / "checkpoints" / "500").mkdir(parents=True)
        (run / "checkpoints" / "500" / "state").write_text("weights")
        for file in ("command.txt", "config.json", "metrics.jsonl", "train.log", "tokenizer.json"):
            (run / file).write_text(file)
        if finished:
            (run / "result.json").write_text('{"returncode": 0}')
    (group / "experiment.json").write_text("{}")
    (rung / "experiment.json").write_text("{}")
    (group / "wall.json").write_text('{"seconds": 1}')
    archive = tmp_path / "kept.tar.xz"
    out = subprocess.run(["bash", str(KEEP), str(runs), str(archive)], capture_output=True, text=True, check=True)
    assert "kept 2 finished runs" in out.stdout
    with tarfile.open(archive) as tar:
        names = {pathlib.PurePosixPath(n).as_posix().removeprefix("./") for n in tar.getnames()}
    assert {"code/SOURCE.txt", "grid/experiment.json", "grid/wall.json", "grid/a_s0/result.json",
            "grid/a_s0/command.txt", "grid/a_s0/metrics.jsonl", "grid/a_s0/config.json",
            "ladder/d32/experiment.json", "ladder/d32/c_s0/result.json", "ladder/d32/c_s0/metrics.jsonl"} <= names
    assert not any("b_s0" in n or "checkpoints" in n or n.endswith("tokenizer.json") for n in names), names
