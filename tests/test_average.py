"""andrea-average: the mean of a run's checkpoints, as a native export the other commands read."""
import jax
import numpy as np
import pytest

from andrea_jax.errors import ConfigError
from andrea_jax.serve import average, load


def test_the_average_of_two_checkpoints_is_their_mean_and_loads_as_the_newest_step(trained_run, tmp_path, capsys):
    run = trained_run("prores.schedule=none")   # checkpoints at steps 3 and 6
    assert average.main(["--workdir", str(run), "--steps", "6,3", "--out", str(tmp_path / "avg")]) == 0
    assert "runs with step 6's alphas" in capsys.readouterr().out
    averaged = load.load(export=tmp_path / "avg")
    at3, at6 = load.load(workdir=run, step=3), load.load(workdir=run, step=6)
    assert averaged.step == 6
    leaves = zip(*(map(np.asarray, jax.tree.leaves(m.params)) for m in (at3, at6, averaged)))
    n_differ = 0
    for a, b, mean in leaves:
        want = (a.astype(np.float64) + b.astype(np.float64)) / 2
        # (a + b) / 2 in float32 is one rounding of the sum: within eps of the largest |value|, by construction
        np.testing.assert_allclose(mean, want, rtol=0, atol=2 * np.finfo(np.float32).eps * np.abs(want).max())
        n_differ += int(np.any(a != b))
    assert n_differ > 0  # the two checkpoints differ: the mean is not either of them


def test_an_average_across_the_prores_warmup_or_of_one_step_is_refused(trained_run, tmp_path, capsys):
    run = trained_run()  # prores.warmup=4: the alphas at step 3 are not those of step 6
    assert average.main(["--workdir", str(run), "--steps", "3,6", "--out", str(tmp_path / "avg")]) == 2
    assert "steps [3] have other ProRes alphas than step 6" in capsys.readouterr().err
    assert not (tmp_path / "avg").exists()
    with pytest.raises(ConfigError, match="at least two different checkpoint steps"):
        average.parse_steps("6,6")
    assert average.main(["--workdir", str(run), "--steps", "3,9", "--out", str(tmp_path / "avg")]) == 1
    assert "no such checkpoint; steps kept: 3, 6" in capsys.readouterr().err
