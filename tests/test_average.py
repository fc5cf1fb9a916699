"""andrea-average: the mean of a run's checkpoints, as a native export the other commands read."""
import jax
import numpy as np
import pytest

from andrea_jax.errors import ConfigError
from andrea_jax.serve import average, load


def test_the_average_of_three_checkpoints_is_their_mean_and_loads_as_the_newest_step(trained_run, tmp_path, capsys):
    run = trained_run("prores.schedule=none", steps=9)   # checkpoints at steps 3, 6 and 9
    assert average.main(["--workdir", str(run), "--steps", "9,3, 6,", "--out", str(tmp_path / "avg")]) == 0
    assert f"wrote the average of {run} steps 3,6,9 (runs with step 9's alphas)" in capsys.readouterr().out
    averaged = load.load(export=tmp_path / "avg")
    models = [load.load(workdir=run, step=step) for step in (3, 6, 9)]
    assert averaged.step == 9
    leaves = zip(*(map(np.asarray, jax.tree.leaves(m.params)) for m in (*models, averaged)))
    n_differ = 0
    for *each, mean in leaves:
        want = sum(x.astype(np.float64) for x in each) / 3
        # two float32 additions and a division, in numpy: measured at most 1.0 eps of the largest |value|
        np.testing.assert_allclose(mean, want, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(want).max())
        n_differ += int(np.any(each[0] != each[2]))
    assert n_differ > 0  # the checkpoints differ: the mean is not any of them


def test_an_average_across_the_prores_warmup_or_of_one_step_is_refused(trained_run, tmp_path, capsys):
    run = trained_run()  # prores.warmup=4: the alphas at step 3 are not those of step 6
    assert average.main(["--workdir", str(run), "--steps", "3,6", "--out", str(tmp_path / "avg")]) == 2
    assert "steps [3] have other ProRes alphas than step 6" in capsys.readouterr().err
    assert not (tmp_path / "avg").exists()
    for text in ("6,6", "6", ""):
        with pytest.raises(ConfigError, match="at least two different checkpoint steps"):
            average.parse_steps(text)
    with pytest.raises(ConfigError, match="'3,x': a comma-separated list of checkpoint steps"):
        average.parse_steps("3,x")
    assert average.main(["--workdir", str(run), "--steps", "3,9", "--out", str(tmp_path / "avg")]) == 1
    assert "no such checkpoint; steps kept: 3, 6" in capsys.readouterr().err
