"""Configs: the named configs load and validate; every bad setting fails naming its key, before jax
compiles anything."""
import subprocess
import sys

import pytest

import train
from andrea_jax import config as config_lib, configs


@pytest.mark.parametrize("name", ["tiny", "andrea_120m"])
def test_named_configs_validate(name):
    cfg = config_lib.validate(configs.load(name))
    assert cfg.model.d_model % cfg.model.n_head == 0


def test_andrea_120m_is_the_spec_model():
    m = configs.load("andrea_120m").model
    assert (m.vocab_size, m.seq_len, m.d_model, m.n_layer, m.n_head, m.mlp_ratio * m.d_model) == \
        (8449, 1024, 768, 12, 12, 3072)


def test_overrides_are_parsed_by_declared_type():
    cfg = config_lib.override(configs.load("tiny"), [
        "model.n_layer=6", "optim.lr=1e-3", "model.remat=true", "prores.schedule=equal", "train.steps=1_000"])
    assert (cfg.model.n_layer, cfg.optim.lr, cfg.model.remat, cfg.prores.schedule, cfg.train.steps) == \
        (6, 1e-3, "full", "equal", 1000)   # the old boolean true means remat full


@pytest.mark.parametrize("assignment,named", [
    ("model.widht=3", "model.widht"),
    ("modle.d_model=3", "modle.d_model"),
    ("model.d_model=wide", "model.d_model"),
    ("model.remat=maybe", "model.remat"),
    ("model.d_model=130", "model.d_model"),       # not divisible by 4 heads
    ("prores.warmup=-5", "prores.warmup"),
    ("optim.z_loss=-1", "optim.z_loss"),
    ("optim.skip_spikes=nan", "optim.skip_spikes"),
    ("optim.skip_spikes_window=1", "optim.skip_spikes_window"),
    ("prores.schedule=cosine", "prores.schedule"),
    ("optim.schedule=step", "optim.schedule"),
    ("kernels.impl=cuda", "kernels.impl"),
    ("train.batch_size=0", "train.batch_size"),
    ("model.dtype=float16", "model.dtype"),
    ("model.n_layer", "model.n_layer"),
])
def test_bad_setting_exits_nonzero_naming_the_key(assignment, named, capsys, tmp_path):
    rc = train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", assignment])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("config error:") and named in err and "\n" not in err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_unknown_config_name_lists_the_known_ones(capsys, tmp_path):
    assert train.main(["--config", "huge", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown config 'huge'" in err and "tiny" in err


@pytest.mark.parametrize("assignment,message", [
    ("model.n_layers=4", "unknown config key 'model.n_layers'; did you mean model.n_layer?"),
    ("modle.n_layer=4", "unknown config key 'modle.n_layer': no section 'modle'; did you mean model.n_layer?"),
    ("train.lr=1e-3", "unknown config key 'train.lr'; did you mean optim.lr?"),   # the name in another section
    ("diagnostic.zzz=1",
     "unknown config key 'diagnostic.zzz': no section 'diagnostic'; did you mean section diagnostics?"),
    ("model.qqqq=1", "unknown config key 'model.qqqq'"),                         # nothing near: no guess
    ("xyz.abc=1", "unknown config key 'xyz.abc': no section 'xyz'"),
])
def test_unknown_key_suggests_the_nearest_known_one(assignment, message, capsys, tmp_path):
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", assignment]) == 2
    assert capsys.readouterr().err.strip() == f"config error: {message}"


def test_unknown_section_of_a_saved_config_suggests_the_nearest():
    tree = configs.load("tiny").to_dict()
    tree["modle"] = tree.pop("model")
    with pytest.raises(config_lib.ConfigError, match=r"^unknown config section 'modle'; did you mean model\?$"):
        configs.from_dict(tree)


def test_a_saved_config_with_retired_keys_still_loads():
    tree = configs.load("tiny").to_dict()
    tree["data"] |= {"pretokenize": True, "stream_workers": 2}
    assert configs.from_dict(tree) == configs.from_dict(configs.load("tiny").to_dict())
    tree["data"]["path_typo"] = "x"   # a key that was never a field is still refused
    with pytest.raises(config_lib.ConfigError):
        configs.from_dict(tree)


def test_config_file_with_wrong_field_type_is_rejected(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("from andrea_jax.config import Config, ModelConfig\n"
                    "def get_config():\n    return Config(model=ModelConfig(n_layer='12'))\n")
    with pytest.raises(config_lib.ConfigError, match="model.n_layer: expected int"):
        config_lib.validate(configs.load(str(path)))


def test_cli_process_exits_nonzero_before_compiling(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--config", "tiny", "--workdir", str(tmp_path),
                           "--set", "model.n_head=5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "model.d_model" in proc.stderr and "model.n_head=5" in proc.stderr
