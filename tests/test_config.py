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


# Each check of the config's sections and of `validate`, with a setting that only it refuses: the
# error names the key and says why. Every line here is one `need`, `one_of` or `positive` of
# andrea_jax/config.py and andrea_jax/config_check.py (tiny's model: seq_len 128, 4 heads of 32).
REFUSED = [
    (["model.vocab_size=0"], "model.vocab_size", "must be positive"),
    (["model.seq_len=0"], "model.seq_len", "must be positive"),
    (["model.d_model=0"], "model.d_model", "must be positive"),
    (["model.n_layer=0"], "model.n_layer", "must be positive"),
    (["model.n_head=0"], "model.n_head", "must be positive"),
    (["model.mlp_ratio=0"], "model.mlp_ratio", "must be positive"),
    (["model.ln_eps=0"], "model.ln_eps", "must be positive"),
    (["model.init_std=0"], "model.init_std", "must be positive"),
    (["model.vocab_size=256"], "model.vocab_size", "must be >= 257"),
    (["model.d_model=130"], "model.d_model", "130 is not divisible by model.n_head=4"),
    (["model.dtype=float16"], "model.dtype", "must be float32 or bfloat16"),
    (["model.remat=maybe"], "model.remat", "unknown remat policy 'maybe'"),
    (["model.attention=flash"], "model.attention", "must be auto, xla or cudnn"),
    (["model.norm=mid"], "model.norm", "unknown placement 'mid'"),
    (["model.init=xavier"], "model.init", "unknown init 'xavier'"),
    (["model.gates=always"], "model.gates", "unknown gates 'always'"),
    (["model.loss_chunks=-1"], "model.loss_chunks", "must be 0 (off) or divide"),
    (["model.loss_chunks=3"], "model.loss_chunks", "must be 0 (off) or divide"),
    (["model.family=bert"], "model.family", "unknown model family 'bert'"),
    (["model.seq_len_ramp=48@1000"], "model.seq_len_ramp", "stage length 48 must be below and divide"),
    (["model.seq_len_ramp=128@1000"], "model.seq_len_ramp", "stage length 128 must be below and divide"),
    (["model.loss_chunks=64", "model.seq_len_ramp=32@4096"], "model.seq_len_ramp",
     "stage length 32 is not divisible by model.loss_chunks=64"),
    (["model.depth_param=mup"], "model.depth_param", "unknown depth parameterisation 'mup'"),
    (["model.depth_base=0"], "model.depth_base", "must be >= 1"),
    (["model.family=llama", "model.d_model=132"], "model.family", "the head dim 33"),
    (["prores.schedule=cosine"], "prores.schedule", "unknown schedule 'cosine'"),
    (["prores.warmup=-5"], "prores.warmup", "must be >= 0"),
    (["prores.scale_updates=beta"], "prores.scale_updates", "unknown update scaling 'beta'"),
    (["prores.warmup_tokens=-1"], "prores.warmup_tokens", "must be >= 0"),
    (["prores.forward=false"], "prores.forward", "false leaves alpha unused"),
    (["optim.name=sgd"], "optim.name", "unknown optimizer 'sgd'"),
    (["optim.lr=0"], "optim.lr", "must be positive"),
    (["optim.lr=inf"], "optim.lr", "must be positive"),
    (["optim.muon_lr=0"], "optim.muon_lr", "must be positive"),
    (["optim.schedule=step"], "optim.schedule", "must be cosine or wsd"),
    (["optim.warmup_steps=-1"], "optim.warmup_steps", "must be >= 0"),
    (["optim.min_lr_ratio=1.5"], "optim.min_lr_ratio", "must be in [0, 1]"),
    (["optim.decay_fraction=0"], "optim.decay_fraction", "must be in (0, 1]"),
    (["optim.ema=1"], "optim.ema", "must be in [0, 1)"),
    (["optim.decay_steps=-1"], "optim.decay_steps", "must be >= 0"),
    (["optim.decay_steps=5"], "optim.decay_steps", "is for optim.schedule=wsd, not cosine"),
    (["optim.b1=1"], "optim.b1", "must be in [0, 1)"),
    (["optim.b2=-0.1"], "optim.b2", "must be in [0, 1)"),
    (["optim.muon_momentum=1"], "optim.muon_momentum", "must be in [0, 1)"),
    (["optim.eps=0"], "optim.eps", "must be positive"),
    (["optim.clip_norm=0"], "optim.clip_norm", "must be positive"),
    (["optim.max_consecutive_skips=0"], "optim.max_consecutive_skips", "must be positive"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay", "must be >= 0"),
    (["optim.muon_weight_decay=-0.1"], "optim.muon_weight_decay", "must be >= 0"),
    (["optim.z_loss=inf"], "optim.z_loss", "must be >= 0"),
    (["optim.skip_spikes=-1"], "optim.skip_spikes", "must be >= 0"),
    (["optim.skip_spikes=nan"], "optim.skip_spikes", "must be >= 0"),
    (["optim.skip_spikes_window=1"], "optim.skip_spikes_window", "must be >= 2"),
    (["optim.z_loss=-1"], "optim.z_loss", "must be >= 0"),
    (["train.steps=0"], "train.steps", "must be positive"),
    (["train.batch_size=0"], "train.batch_size", "must be positive"),
    (["train.log_every=0"], "train.log_every", "must be positive"),
    (["train.eval_batches=0"], "train.eval_batches", "must be positive"),
    (["train.keep_checkpoints=0"], "train.keep_checkpoints", "must be positive"),
    (["train.microbatches=0"], "train.microbatches", "must be positive"),
    (["train.eval_every=-1"], "train.eval_every", "must be >= 0"),
    (["train.sample_tokens=-1"], "train.sample_tokens", "must be >= 0"),
    (["train.checkpoint_every=-1"], "train.checkpoint_every", "must be >= 0"),
    (["train.microbatches=3"], "train.microbatches", "3 does not divide train.batch_size=16"),
    (["train.profile=5:2"], "train.profile", "must be START:END"),
    (["train.profile=0:2"], "train.profile", "must be START:END"),
    (["train.profile=5"], "train.profile", "must be START:END"),
    (["train.profile=a:b"], "train.profile", "must be START:END"),
    (["train.peak_tflops=-1"], "train.peak_tflops", "must be >= 0"),
    (["train.tokens=-1"], "train.tokens", "must be >= 0"),
    (["train.flops=-1"], "train.flops", "must be >= 0"),
    (["train.flops=inf"], "train.flops", "must be >= 0"),
    (["train.tokens=1000", "train.flops=1e9"], "train.flops", "set only one of"),
    (["train.data_seed=-2"], "train.data_seed", "must be >= 0, or -1"),
    (["train.batch_ramp=32@1000"], "train.batch_ramp", "stage batch 32 exceeds train.batch_size=16"),
    (["train.microbatches=4", "train.batch_ramp=2@1000"], "train.batch_ramp",
     "stage batch 2 is not divisible by train.microbatches=4"),
    (["data.source=web"], "data.source", "unknown source 'web'"),
    (["data.source=files"], "data.path", "data.source=files needs"),
    (["data.source=prepared"], "data.path", "data.source=prepared needs"),
    (["data.mixture=a:1"], "data.mixture", "is only read with data.source=prepared"),
    (["data.source=prepared", "data.path=a", "data.mixture=b:1"], "data.path", "is replaced by data.mixture"),
    (["data.source=prepared", "data.mixture=a:0"], "data.mixture", "must be PATH:WEIGHT"),
    (["data.path=a"], "data.path", "is only read with data.source=files or prepared"),
    (["data.source=tfds"], "data.tfds_name", "data.source=tfds needs"),
    (["data.tfds_name=lm1b"], "data.tfds_name", "is only read with data.source=tfds"),
    (["data.tfds_val_split=test"], "data.tfds_val_split", "is only read with data.source=tfds"),
    (["data.source=tfds", "data.tfds_name=lm1b", "data.tfds_split="], "data.tfds_split", "must name the split"),
    (["data.val_fraction=0"], "data.val_fraction", "must be in (0, 1)"),
    (["data.val_fraction=1"], "data.val_fraction", "must be in (0, 1)"),
    (["data.tokenizer_sample_mb=0"], "data.tokenizer_sample_mb", "must be positive"),
    (["diagnostics.every=-1"], "diagnostics.every", "must be >= 0"),
    (["diagnostics.spike_window=1"], "diagnostics.spike_window", "must be >= 2"),
    (["diagnostics.spike_sigmas=0"], "diagnostics.spike_sigmas", "must be positive"),
    (["diagnostics.knockout_chunk=-1"], "diagnostics.knockout_chunk", "must be >= 0"),
    (["kernels.impl=cuda"], "kernels.impl", "must be auto, xla, pallas or triton"),
    (["mesh.data=0"], "mesh.data", "must be positive or -1"),
    (["mesh.fsdp=-2"], "mesh.fsdp", "must be positive or -1"),
    (["mesh.tensor=0"], "mesh.tensor", "must be positive or -1"),
    (["mesh.fsdp=-1"], "mesh.data", "only one mesh axis may be -1"),
    (["mesh.rules=embed"], "mesh.rules", "is not NAME=AXIS"),
    (["model.family=llama", "model.remat=gelu"], "model.remat", "model.family=llama's MLP is SwiGLU"),
    (["model.family=llama", "kernels.impl=pallas"], "kernels.impl", "has no RMSNorm or SwiGLU kernels"),
    (["optim.name=muon", "model.depth_param=depth_mup"], "optim.name", "muon has no rules"),
    (["model.reset_positions=true"], "model.reset_positions", "needs data.document_mask=true"),
    (["data.document_mask=true", "model.seq_len=127", "model.loss_chunks=0"], "data.document_mask",
     "at an even model.seq_len"),
    (["train.batch_ramp=8@1000", "train.flops=1e9"], "train.flops", "a FLOP budget is not resolved"),
    (["data.source=prepared", "data.mixture=a:1", "train.batch_ramp=8@1000"], "data.mixture", "is not served at"),
    (["train.batch_ramp=1@1000", "model.seq_len_ramp=64@2000"], "train.batch_ramp", "does not read whole windows"),
    (["data.document_mask=true", "train.batch_size=128", "model.seq_len_ramp=1@1000"], "model.seq_len_ramp",
     "takes data.document_mask only at even lengths"),
]


@pytest.mark.parametrize("assignments,key,why", REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_every_check_refuses_its_bad_value_naming_the_key(assignments, key, why):
    with pytest.raises(config_lib.ConfigError) as refused:
        config_lib.validate(config_lib.override(configs.load("tiny"), assignments))
    assert str(refused.value).startswith(f"{key}: ") and why in str(refused.value), str(refused.value)
