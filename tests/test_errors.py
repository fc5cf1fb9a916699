"""Every error a user can cause ends a real train.py process with one line on stderr: exit 2 for
what the command or config asks (fix it), 1 for a run that failed; --debug shows the traceback."""
import subprocess

import pytest

from _devices import cpu_devices_env
from _helpers import ROOT, train_command

TOY = ["train.steps=2", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=1", "model.d_model=32",
       "model.seq_len=16", "model.vocab_size=300", "diagnostics.tensorboard=false"]


def start(tmp_path, config, workdir, *settings, env=None, flags=()):
    cmd = train_command(workdir, settings, *flags, config=config)
    env = {**cpu_devices_env(1), "ANDREA_CACHE": str(tmp_path / "cache"), **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.fixture
def not_python(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def get_config(:\n    return None\n")
    return path


def test_each_bad_input_is_one_line_and_its_exit_code(tmp_path, tok_path, not_python):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    toy = TOY + [f"data.tokenizer={tok_path}"]
    cases = {  # name: (process, exit code, words of the one line)
        "config not python": (start(tmp_path, not_python, tmp_path / "w1"), 2,
                              ["config error:", "broken.py", "line 1", "SyntaxError"]),
        # A filesystem problem is not a config error: exit 1, as a busy workdir.
        "workdir is a file": (start(tmp_path, "tiny", a_file, *toy), 1, ["error:", str(a_file), "file"]),
        # The test extra installs jax-triton (its kernels' PTX is assembled without a GPU): on this
        # CPU the triton backend is refused for want of a GPU (without the package:
        # test_missing_extras.py).
        "triton on a CPU": (start(tmp_path, "tiny", tmp_path / "w3", *toy, "kernels.impl=triton"), 2,
                            ["config error:", "triton", "CUDA GPU"]),
        "indivisible batch": (start(tmp_path, "tiny", tmp_path / "w4", *toy, "train.batch_size=3",
                                    env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}), 2,
                              ["config error:", "train.batch_size=3", "2"]),
        "missing corpus": (start(tmp_path, "tiny", tmp_path / "w5", *toy, "data.source=files",
                                       f"data.path={tmp_path / 'no_such_corpus'}"), 1, ["error:", "no_such_corpus"]),
    }
    for name, (proc, code, words) in cases.items():
        out, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert proc.returncode == code and len(lines) == 1, (name, proc.returncode, err[-3000:])
        assert all(w in lines[0] for w in words), (name, lines[0])
        assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path, not_python):
    proc = start(tmp_path, not_python, tmp_path / "w", flags=["--debug"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in err and "SyntaxError" in err
