"""The typed config tree, its loading from `configs/`, `--set` overrides and validation.

Every field is documented where it is declared. `validate` runs before anything is traced or
compiled, and every error names the offending key (`section.key`).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import pathlib
import typing
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A bad config: the message names the key."""


NORMS = ("pre", "post", "sandwich", "deepnorm", "lns")   # block placements, paper Table 1 (SPEC 2)
INITS = ("normal", "scaled", "ds", "deepnorm")           # matrix inits (SPEC 2)
GATES = ("none", "learned")                              # residual gates besides the ProRes alpha
REMATS = ("none", "full", "dots")                        # model.remat policies (andrea_jax.model)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 8449      # 256 bytes + 8192 BPE merges + <|endoftext|> (SPEC 1)
    seq_len: int = 1024         # context length = number of learned position embeddings
    d_model: int = 768          # residual stream width
    n_layer: int = 12           # number of blocks L
    n_head: int = 12            # attention heads; head dim = d_model / n_head
    mlp_ratio: int = 4          # mlp_dim = mlp_ratio * d_model (SPEC 1: 3072 for 768)
    ln_eps: float = 1e-5        # LayerNorm epsilon (GPT-2 convention)
    init_std: float = 0.02      # std of the normal init of every matrix and embedding
    dtype: str = "float32"      # compute dtype: float32 (CPU default) or bfloat16; params stay float32
    remat: str = "none"         # one of REMATS: what the backward pass recomputes of each block instead of storing it
                                # (none; full: everything, the least memory; dots: all but the projection matmuls' outputs)
    attention: str = "auto"     # auto (cuDNN flash attention where a GPU, bf16 and the head dim allow; else xla) | xla | cudnn (falls back to xla, saying why)
    norm: str = "pre"           # block placement, one of NORMS (formulas: SPEC 2 / andrea_jax.model)
    init: str = "normal"        # one of INITS: normal, scaled (out proj / sqrt(2L)), ds (/ sqrt(2l)), deepnorm
    gates: str = "none"         # learned: a trainable scalar per block, from 0, times alpha (ReZero; +L params)

    def __post_init__(self):
        # model.remat was a bool before none|full|dots: True / "true" (old configs, checkpoints,
        # --set model.remat=true) still mean full, False / "false" none.
        if isinstance(self.remat, bool) or str(self.remat).lower() in ("true", "false"):
            object.__setattr__(self, "remat", "full" if str(self.remat).lower() == "true" else "none")


@dataclass(frozen=True)
class ProResConfig:
    schedule: str = "linear"    # one of andrea_jax.prores.SCHEDULES; `none` turns ProRes off
    warmup: int = 1000          # T: warmup of the first layer, in optimizer steps (paper default)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 6e-4            # peak learning rate
    schedule: str = "cosine"    # cosine (warmup + cosine) or wsd (warmup-stable-decay)
    warmup_steps: int = 2000    # linear LR warmup, in steps (paper: 2000)
    min_lr_ratio: float = 0.1   # cosine: final LR as a fraction of the peak
    decay_fraction: float = 0.1  # wsd: the last fraction of steps decays linearly to 0 (paper: 10%)
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1   # applied to matrices (kernels, embeddings) only
    clip_norm: float = 1.0      # global-norm gradient clipping
    skip_nonfinite: bool = False  # skip an update whose gradient is not finite (counted as skipped_updates) instead of stopping the run; off: a NaN is a bug to see
    max_consecutive_skips: int = 10  # skip_nonfinite: stop after this many skipped updates in a row (a stuck run; a spike skips a few)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100_000        # total optimizer updates
    batch_size: int = 512       # global batch, in sequences
    seed: int = 0               # seeds init, data order and sampling
    log_every: int = 10         # steps between metric lines (each costs one host sync)
    eval_every: int = 1000      # steps between validation passes; 0 = only at the end
    eval_batches: int = 8       # validation batches per pass (the set itself is fixed)
    sample_tokens: int = 0      # tokens of text generated at the end of the run (0 = none)
    checkpoint_every: int = 1000  # steps between Orbax checkpoints (and at the end); 0 = none, no resume
    keep_checkpoints: int = 3   # newest checkpoints kept on disk
    microbatches: int = 1       # gradient accumulation: each batch runs as this many equal slices, one update (memory of one slice)


@dataclass(frozen=True)
class DataConfig:
    source: str = "embedded"    # embedded (shipped tinyshakespeare) | files (data.path) | tfds (data.tfds_name) | prepared (data.path)
    path: str = ""              # files: a folder (read recursively), a file or a glob of .txt / .jsonl (`text` field) files;
                                # prepared: the folder `python -m andrea_jax.data.prepare --out` wrote
    tfds_name: str = ""         # tfds: a registered TFDS text dataset (a `text` feature), e.g. lm1b or c4/en
    tfds_split: str = "train"   # tfds: the split trained on, in TFDS split syntax (e.g. train[:10%])
    tfds_val_split: str = ""    # tfds: the split validated on (e.g. test); empty = the val_fraction tail of training
    tfds_download: bool = True  # tfds: download and prepare the dataset when data_dir lacks it (c4: hundreds of GB)
    data_dir: str = ""          # TFDS data_dir; empty = $ANDREA_CACHE/tfds (embedded, files) or TFDS's default (tfds)
    val_fraction: float = 0.05  # tail of the token stream held out as the fixed validation set (no tfds_val_split)
    tokenizer: str = ""         # path of a tokenizer.json to use; empty = train on the corpus (cached beside it)
    tokenizer_sample_mb: int = 64  # a trained tokenizer sees a seeded uniform sample of about this much of the documents
    pretokenize: bool = True    # false: grain workers tokenize and pack documents on the fly (slower, not bit-identical)
    stream_workers: int = 2     # pretokenize=false: grain worker processes that tokenize (0 = in the training process)


@dataclass(frozen=True)
class DiagnosticsConfig:
    every: int = 0              # steps between per-layer diagnostics (RMS, branch ratios, grad norms); 0 = off
    spike_window: int = 1000    # loss-spike score: previous steps in the rolling mean/std (OLMo 2: 1000)
    spike_sigmas: float = 6.0   # loss-spike score: a spike is a loss above rolling mean + this many stds
    tensorboard: bool = True    # also write every metric line as TensorBoard events under WORKDIR/tb


@dataclass(frozen=True)
class KernelsConfig:
    impl: str = "auto"          # xla | pallas | triton | auto (pallas on GPU, xla on CPU)


@dataclass(frozen=True)
class MeshConfig:
    # Device mesh (data x fsdp x tensor must be the device count; one entry may be -1 = the rest).
    # What each axis splits: andrea_jax.sharding. Defaults: plain data parallelism, as before.
    data: int = -1              # data parallel: batch split, state replicated
    fsdp: int = 1               # fully sharded data parallel: batch split, matrices and Adam moments split on d_model
    tensor: int = 1             # tensor parallel: heads, MLP width, vocabulary split; must divide n_head and the MLP width
    rules: str = ""             # overrides of sharding.RULES, "NAME=AXIS+AXIS,NAME=" (empty after = = whole); "" = none


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    prores: ProResConfig = field(default_factory=ProResConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


def load(name_or_path: str) -> Config:
    """Loads `configs/NAME.py` or a path to such a file; the module defines `get_config()`."""
    path = pathlib.Path(name_or_path)
    # A config is user code: whatever it raises (a syntax error, a bad import) is a config error.
    try:
        if path.suffix == ".py":
            if not path.is_file():
                raise ConfigError(f"config file {name_or_path!r} does not exist")
            spec = importlib.util.spec_from_file_location(f"_andrea_config_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = _import_named(name_or_path)
        if not callable(getattr(module, "get_config", None)):
            raise ConfigError(f"config {name_or_path!r} defines no get_config()")
        config = module.get_config()
    except ConfigError:
        raise
    except Exception as e:
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        message = " ".join(str(getattr(e, "msg", None) or e).split())
        raise ConfigError(f"config {name_or_path!r} cannot be loaded{where}: "
                          f"{type(e).__name__}: {message}") from e
    if not isinstance(config, Config):
        raise ConfigError(f"get_config() in {name_or_path!r} must return andrea_jax.config.Config")
    return config


def _import_named(name: str):
    try:
        return importlib.import_module(f"configs.{name}")
    except ModuleNotFoundError as e:
        if not e.name or not f"configs.{name}.".startswith(e.name + "."):
            raise  # the config exists but imports something missing: not an unknown name
        known = sorted(p.stem for p in _CONFIG_DIR.glob("*.py") if not p.stem.startswith("_"))
        raise ConfigError(f"unknown config {name!r}; known: {', '.join(known)}") from None


def _parse(key: str, text: str, kind: type):
    try:
        if kind is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind is int:
            return int(text.replace("_", ""))
        return kind(text)
    except ValueError:
        raise ConfigError(f"{key}: expected {kind.__name__}, got {text!r}") from None


def override(config: Config, assignments: typing.Sequence[str]) -> Config:
    """Applies `section.key=value` strings, parsing each value by the field's declared type."""
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"override {assignment!r} is not of the form section.key=value")
        if section not in {f.name for f in dataclasses.fields(config)}:
            raise ConfigError(f"unknown config key {key!r}: no section {section!r}")
        sub = getattr(config, section)
        hints = typing.get_type_hints(type(sub))
        if name not in hints:
            raise ConfigError(f"unknown config key {key!r}")
        sub = dataclasses.replace(sub, **{name: _parse(key, text, hints[name])})
        config = dataclasses.replace(config, **{section: sub})
    return config


def _check_types(config: Config) -> None:
    for section in dataclasses.fields(config):
        sub = getattr(config, section.name)
        for name, kind in typing.get_type_hints(type(sub)).items():
            value = getattr(sub, name)
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise ConfigError(
                    f"{section.name}.{name}: expected {kind.__name__}, got {type(value).__name__} {value!r}")


def validate(config: Config) -> Config:
    """Raises ConfigError naming the first invalid key; returns the config unchanged."""
    from andrea_jax import prores

    _check_types(config)
    m, p, o, t, d, k = (config.model, config.prores, config.optim, config.train,
                        config.data, config.kernels)

    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {why}")

    for key, value in [("model.vocab_size", m.vocab_size), ("model.seq_len", m.seq_len),
                       ("model.d_model", m.d_model), ("model.n_layer", m.n_layer),
                       ("model.n_head", m.n_head), ("model.mlp_ratio", m.mlp_ratio),
                       ("train.steps", t.steps), ("train.batch_size", t.batch_size),
                       ("train.log_every", t.log_every), ("train.eval_batches", t.eval_batches)]:
        need(value > 0, key, f"must be positive, got {value}")
    need(m.d_model % m.n_head == 0, "model.d_model",
         f"{m.d_model} is not divisible by model.n_head={m.n_head}")
    need(m.vocab_size >= 257, "model.vocab_size", f"must be >= 257 (256 bytes + end-of-text), got {m.vocab_size}")
    need(m.ln_eps > 0, "model.ln_eps", f"must be positive, got {m.ln_eps}")
    need(m.init_std > 0, "model.init_std", f"must be positive, got {m.init_std}")
    need(m.dtype in ("float32", "bfloat16"), "model.dtype", f"must be float32 or bfloat16, got {m.dtype!r}")
    need(m.attention in ("auto", "xla", "cudnn"), "model.attention",
         f"must be auto, xla or cudnn, got {m.attention!r}")
    need(m.norm in NORMS, "model.norm", f"unknown placement {m.norm!r}; known: {', '.join(NORMS)}")
    need(m.init in INITS, "model.init", f"unknown init {m.init!r}; known: {', '.join(INITS)}")
    need(m.gates in GATES, "model.gates", f"unknown gates {m.gates!r}; known: {', '.join(GATES)}")
    need(m.remat in REMATS, "model.remat", f"unknown remat policy {m.remat!r}; known: {', '.join(REMATS)}")
    g = config.diagnostics
    need(g.every >= 0, "diagnostics.every", f"must be >= 0, got {g.every}")
    need(g.spike_window >= 2, "diagnostics.spike_window", f"must be >= 2, got {g.spike_window}")
    need(g.spike_sigmas > 0, "diagnostics.spike_sigmas", f"must be positive, got {g.spike_sigmas}")
    need(p.schedule in prores.SCHEDULES, "prores.schedule",
         f"unknown schedule {p.schedule!r}; known: {', '.join(prores.SCHEDULES)}")
    need(p.warmup >= 0, "prores.warmup", f"must be >= 0, got {p.warmup}")
    need(o.lr > 0 and math.isfinite(o.lr), "optim.lr", f"must be positive, got {o.lr}")
    need(o.schedule in ("cosine", "wsd"), "optim.schedule", f"must be cosine or wsd, got {o.schedule!r}")
    need(o.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {o.warmup_steps}")
    need(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {o.min_lr_ratio}")
    need(0 < o.decay_fraction <= 1, "optim.decay_fraction", f"must be in (0, 1], got {o.decay_fraction}")
    need(0 <= o.b1 < 1, "optim.b1", f"must be in [0, 1), got {o.b1}")
    need(0 <= o.b2 < 1, "optim.b2", f"must be in [0, 1), got {o.b2}")
    need(o.eps > 0, "optim.eps", f"must be positive, got {o.eps}")
    need(o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}")
    need(o.clip_norm > 0, "optim.clip_norm", f"must be positive, got {o.clip_norm}")
    need(o.max_consecutive_skips > 0, "optim.max_consecutive_skips", f"must be positive, got {o.max_consecutive_skips}")
    need(t.eval_every >= 0, "train.eval_every", f"must be >= 0, got {t.eval_every}")
    need(t.sample_tokens >= 0, "train.sample_tokens", f"must be >= 0, got {t.sample_tokens}")
    need(t.checkpoint_every >= 0, "train.checkpoint_every", f"must be >= 0, got {t.checkpoint_every}")
    need(t.keep_checkpoints > 0, "train.keep_checkpoints", f"must be positive, got {t.keep_checkpoints}")
    need(d.source in ("embedded", "files", "tfds", "prepared"), "data.source",
         f"unknown source {d.source!r}; known: embedded, files, tfds, prepared")
    need(d.source != "files" or bool(d.path), "data.path",
         "data.source=files needs a folder, file or glob of .txt / .jsonl files")
    need(d.source != "prepared" or bool(d.path), "data.path",
         "data.source=prepared needs the folder written by python -m andrea_jax.data.prepare")
    need(d.source in ("files", "prepared") or not d.path, "data.path",
         f"is only read with data.source=files or prepared, not {d.source!r}")
    need(d.source != "tfds" or bool(d.tfds_name), "data.tfds_name",
         "data.source=tfds needs a TFDS dataset name, e.g. lm1b or c4/en")
    for key, value in (("data.tfds_name", d.tfds_name), ("data.tfds_val_split", d.tfds_val_split)):
        need(d.source == "tfds" or not value, key, f"is only read with data.source=tfds, not {d.source!r}")
    need(d.source != "tfds" or bool(d.tfds_split), "data.tfds_split", "must name the split to train on")
    need(0 < d.val_fraction < 1, "data.val_fraction", f"must be in (0, 1), got {d.val_fraction}")
    need(d.tokenizer_sample_mb > 0, "data.tokenizer_sample_mb", f"must be positive, got {d.tokenizer_sample_mb}")
    need(d.stream_workers >= 0, "data.stream_workers", f"must be >= 0, got {d.stream_workers}")
    need(d.pretokenize or d.source != "prepared", "data.pretokenize",
         "must be true with data.source=prepared: a prepared dataset is already tokenized")
    need(k.impl in ("auto", "xla", "pallas", "triton"), "kernels.impl",
         f"must be auto, xla, pallas or triton, got {k.impl!r}")
    need(t.microbatches > 0, "train.microbatches", f"must be positive, got {t.microbatches}")
    need(t.batch_size % t.microbatches == 0, "train.microbatches",
         f"{t.microbatches} does not divide train.batch_size={t.batch_size}")
    mesh = config.mesh
    for key in ("data", "fsdp", "tensor"):  # the device count is checked when the mesh is made
        value = getattr(mesh, key)
        need(value >= 1 or value == -1, f"mesh.{key}", f"must be positive or -1 (the rest), got {value}")
    need([mesh.data, mesh.fsdp, mesh.tensor].count(-1) <= 1, "mesh.data", "only one mesh axis may be -1")
    from andrea_jax import sharding
    sharding.parse_rules(mesh.rules)  # raises ConfigError naming mesh.rules
    return config
