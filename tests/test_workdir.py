"""A run's folder (andrea_jax.workdir): the lock admits one run at a time and names its holder, is
free again when its holder lets go, a workdir that cannot be a folder is one line, and a saved config that
cannot be read is named."""
import os

import pytest

from andrea_jax import workdir
from andrea_jax.config import Config
from andrea_jax.errors import ResumeError, WorkdirBusy, WorkdirError
from andrea_jax.workdir import Workdir


def test_the_lock_admits_one_holder_names_it_and_is_free_after(tmp_path):
    with Workdir(tmp_path).held():
        f, holder = workdir.try_lock(tmp_path / workdir.LOCK)
        assert f is None and holder.startswith(f"pid {os.getpid()} on ")
        with pytest.raises(WorkdirBusy, match=rf"in use by another run \(pid {os.getpid()} on .*\); wait"):
            with Workdir(tmp_path).held():
                pass
    with Workdir(tmp_path).held():  # the block ended: taken again, and the file names only the last holder
        assert len((tmp_path / workdir.LOCK).read_text().splitlines()) == 1


def test_a_lock_file_that_names_no_holder_says_so(tmp_path):
    f, _ = workdir.try_lock(tmp_path / workdir.LOCK)
    try:
        (tmp_path / workdir.LOCK).write_text("")
        assert workdir.try_lock(tmp_path / workdir.LOCK) == (None, "an unknown process")
    finally:
        f.close()


def test_a_workdir_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirError, match=r"is \(or is inside\) an existing file, not a folder"):
        Workdir(tmp_path / "file" / "run").create()
    with pytest.raises(WorkdirError, match=r"cannot be created \(File name too long\)$"):
        Workdir(tmp_path / ("x" * 300)).create()


def test_checkpoint_steps_are_the_finished_ones_in_numeric_order(tmp_path):
    for name in ("10", "9", "100", "12.orbax-checkpoint-tmp-3", "notes"):
        (tmp_path / workdir.CHECKPOINTS / name).mkdir(parents=True)
    (tmp_path / workdir.CHECKPOINTS / "11").write_text("")
    assert Workdir(tmp_path).checkpoint_steps() == [9, 10, 100]
    assert Workdir(tmp_path / "none").checkpoint_steps() == []


def test_a_workdir_without_a_saved_config_resumes_and_an_unreadable_one_is_named(tmp_path):
    Workdir(tmp_path).check_resume(Config(), allow_schedule_change=False)  # nothing saved: nothing to differ
    (tmp_path / workdir.CONFIG).write_text('{"model": ')
    with pytest.raises(ResumeError, match=rf"{tmp_path / workdir.CONFIG} cannot be read \(.*\); it says which "
                                          rf"settings the checkpoints in {tmp_path / workdir.CHECKPOINTS}"):
        Workdir(tmp_path).check_resume(Config(), allow_schedule_change=False)
