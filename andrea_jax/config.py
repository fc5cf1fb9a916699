"""The config's schema: the typed config tree, each field documented where it is declared with the
values it may take (each section's `check`), and the names its fields take.

What reads a config is elsewhere: named configs and saved ones (`from_dict`) load in
andrea_jax.configs, `override` (`--set section.key=value`) is andrea_jax.config_text's, and
`validate`, with the checks that span sections, andrea_jax.config_check's; callers reach those two
here.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from andrea_jax.config_check import need, one_of, positive
from andrea_jax.config_check import validate  # noqa: F401  (callers validate here)
from andrea_jax.config_text import override  # noqa: F401  (callers apply --set here)
from andrea_jax.config_text import parse_mixture, parse_ramp, parse_rules
from andrea_jax.errors import ConfigError  # noqa: F401  (callers catch it here)
from andrea_jax.names import FAMILIES, KERNEL_IMPLS, MESH_AXES, SCHEDULES


NORMS = ("pre", "post", "sandwich", "deepnorm", "lns")   # block placements, ProRes paper Table 1
INITS = ("normal", "scaled", "ds", "deepnorm")           # matrix inits (ProRes paper and its official code)
GATES = ("none", "learned")                              # residual gates besides the ProRes alpha
REMATS = ("none", "full", "dots", "gelu")                # model.remat policies (andrea_jax.model)
UPDATE_SCALES = ("none", "alpha", "sqrt_alpha", "alpha_sq")  # prores.scale_updates: each block's update times this
# model.depth_param: the branch multiplier's exponent a in (L / L0)^-a (andrea_jax.model.depth)
DEPTH_PARAMS = {"sp": 0.0, "depth_mup": 0.5, "completep": 1.0}
OPTIMIZERS = ("adamw", "muon")                           # optim.name (andrea_jax.train.optim)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 8449      # 256 bytes + 8192 BPE merges + <|endoftext|> (the ANDREA document)
    seq_len: int = 1024         # context length = number of learned position embeddings
    d_model: int = 768          # residual stream width
    n_layer: int = 12           # number of blocks L
    n_head: int = 12            # attention heads; head dim = d_model / n_head
    mlp_ratio: int = 4          # mlp_dim = mlp_ratio * d_model (the ANDREA document: 3072 for 768)
    ln_eps: float = 1e-5        # LayerNorm epsilon (GPT-2 convention)
    init_std: float = 0.02      # std of the normal init of every matrix and embedding
    dtype: str = "float32"      # compute dtype: float32 (CPU default) or bfloat16; params stay float32
    remat: str = "none"         # one of REMATS: what the backward pass recomputes of each block instead of storing it
                                # (none; full: everything, the least memory; dots: all but the projection matmuls'
                                # outputs; gelu: only the MLP's GELU output, one elementwise pass)
    attention: str = "auto"     # auto (cuDNN flash attention where a GPU, bf16 and the head dim allow; else xla) | xla
                                # | cudnn (falls back to xla, saying why)
    norm: str = "pre"           # block placement, one of NORMS (formulas: ProRes paper Table 1 / andrea_jax.model)
    init: str = "normal"        # one of INITS: normal, scaled (out proj / sqrt(2L)), ds (/ sqrt(2l)), deepnorm
    gates: str = "none"         # learned: a trainable scalar per block, from 0, times alpha (ReZero; +L params)
    family: str = "gpt2"        # one of FAMILIES: gpt2 (LayerNorm, biases, GELU MLP, learned positions, tied head) |
                                # llama (the official ProRes code's block: RMSNorm, no biases, SwiGLU of width
                                # mlp_ratio x d_model, RoPE, untied head; andrea_jax/model/llama.py)
    qk_norm: bool = False       # RMSNorm (a per-block gain) on each head's queries and keys before attention and RoPE;
                                # export refuses
    zero_init_out: bool = False  # the attention-out and MLP-down projections start at 0 (whatever model.init), so every
                                 # block starts as the identity under the pre, sandwich and lns placements
    depth_param: str = "sp"     # one of DEPTH_PARAMS: sp (none) | depth_mup (a = 1/2, Yang et al. 2310.02244) |
                                # completep (a = 1, Dey et al. 2505.01618): every residual branch times (L / L0)^-a
                                # (times the ProRes alpha), every block parameter's AdamW update (decay included)
                                # times (L / L0)^(a - 1), and optim.eps times (L / L0)^-a for every parameter, as
                                # the CompleteP code (EleutherAI/nanoGPT-mup, branch completep) does at base width;
                                # embeddings, final norm and head keep optim.lr (docs/RESEARCH.md)
    depth_base: int = 12        # L0 of depth_param: the depth whose multipliers are 1 (default: the default n_layer)
    reset_positions: bool = False  # with data.document_mask: learned positions (gpt2) and RoPE (llama) restart at 0 at
                                   # each document of a packed row; generation and evaluation are unchanged
    loss_chunks: int = 0        # the train and eval losses form the float32 logits and their gradient this many
                                # chunks of positions at a time, never whole (andrea_jax/train/chunked_loss.py); must
                                # divide seq_len; 0: the plain loss over the whole logits
    seq_len_ramp: str = ""      # LEN@TOKENS,LEN@TOKENS,...: train on sequences of LEN tokens until TOKENS tokens have
                                # been seen, then the next stage, then model.seq_len; each LEN divides seq_len
                                # (docs/RAMPS.md: the token clock every schedule then runs on); "" = off

    def __post_init__(self):
        # A bool remat (True / "true" in a config, a saved checkpoint's config or --set) means
        # full, False / "false" none.
        if isinstance(self.remat, bool) or str(self.remat).lower() in ("true", "false"):
            object.__setattr__(self, "remat", "full" if str(self.remat).lower() == "true" else "none")

    def check(self) -> None:
        positive("model", self, "vocab_size", "seq_len", "d_model", "n_layer", "n_head", "mlp_ratio",
                 "ln_eps", "init_std")
        need(self.d_model % self.n_head == 0, "model.d_model",
             f"{self.d_model} is not divisible by model.n_head={self.n_head}")
        need(self.vocab_size >= 257, "model.vocab_size",
             f"must be >= 257 (256 bytes + end-of-text), got {self.vocab_size}")
        need(self.dtype in ("float32", "bfloat16"), "model.dtype", f"must be float32 or bfloat16, got {self.dtype!r}")
        need(self.attention in ("auto", "xla", "cudnn"), "model.attention",
             f"must be auto, xla or cudnn, got {self.attention!r}")
        one_of("model.norm", self.norm, NORMS, "placement")
        one_of("model.init", self.init, INITS, "init")
        one_of("model.gates", self.gates, GATES, "gates")
        one_of("model.remat", self.remat, REMATS, "remat policy")
        need(self.loss_chunks >= 0 and (self.loss_chunks == 0 or self.seq_len % self.loss_chunks == 0),
             "model.loss_chunks", f"must be 0 (off) or divide model.seq_len={self.seq_len}, got {self.loss_chunks}")
        one_of("model.family", self.family, FAMILIES, "model family")
        for length, _ in parse_ramp("model.seq_len_ramp", self.seq_len_ramp):
            need(length < self.seq_len and self.seq_len % length == 0, "model.seq_len_ramp",
                 f"stage length {length} must be below and divide model.seq_len={self.seq_len} (a stage's rows are "
                 f"cut from the windows of the full length)")
            need(self.loss_chunks == 0 or length % self.loss_chunks == 0, "model.seq_len_ramp",
                 f"stage length {length} is not divisible by model.loss_chunks={self.loss_chunks}")
        one_of("model.depth_param", self.depth_param, DEPTH_PARAMS, "depth parameterisation")
        need(self.depth_base >= 1, "model.depth_base", f"must be >= 1 (a depth L0), got {self.depth_base}")
        need(self.family != "llama" or (self.d_model // self.n_head) % 2 == 0, "model.family",
             f"llama's RoPE rotates pairs of a head's dimensions: the head dim {self.d_model // self.n_head} "
             f"(model.d_model / model.n_head) must be even")


@dataclass(frozen=True)
class ProResConfig:
    schedule: str = "linear"    # one of SCHEDULES (formulas: andrea_jax.model.prores); `none` turns ProRes off
    warmup: int = 1000          # T: warmup of the first layer, in optimizer steps (paper default)
    warmup_tokens: int = 0      # > 0: T in tokens seen instead (replaces prores.warmup): T = warmup_tokens /
                                # (train.batch_size x model.seq_len) steps of the full shape (docs/RAMPS.md)
    # A deviation from the paper, off by default: multiply block l's AdamW update (decay included)
    # by alpha_l (alpha), sqrt(alpha_l) (sqrt_alpha) or alpha_l^2 (alpha_sq), so a partly-on block
    # moves as little as it counts; Adam's m / sqrt(v) otherwise undoes the alpha that scales its gradient.
    scale_updates: str = "none"
    # false: alpha(l, t) is left out of the forward pass (every branch at 1) and only scale_updates
    # uses it: a per-block learning-rate ramp without ProRes's forward (a control); needs scale_updates.
    forward: bool = True

    def check(self) -> None:
        one_of("prores.schedule", self.schedule, SCHEDULES, "schedule")
        one_of("prores.scale_updates", self.scale_updates, UPDATE_SCALES, "update scaling")
        need(self.warmup >= 0, "prores.warmup", f"must be >= 0, got {self.warmup}")
        need(self.warmup_tokens >= 0, "prores.warmup_tokens", f"must be >= 0 (0 = prores.warmup's steps), "
             f"got {self.warmup_tokens}")
        need(self.forward or self.scale_updates != "none", "prores.forward",
             "false leaves alpha unused unless prores.scale_updates is alpha, sqrt_alpha or alpha_sq")


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"         # one of OPTIMIZERS: adamw, or muon (Muon for the blocks' matrices, AdamW for the rest)
    lr: float = 6e-4            # peak learning rate (with muon: of the AdamW group)
    schedule: str = "cosine"    # cosine (warmup + cosine) or wsd (warmup-stable-decay)
    warmup_steps: int = 2000    # linear LR warmup, in steps (paper: 2000)
    min_lr_ratio: float = 0.1   # cosine: final LR as a fraction of the peak
    decay_fraction: float = 0.1  # wsd: the last fraction of steps decays linearly to 0 (paper: 10%)
    ema: float = 0.0            # > 0: keep an exponential moving average of the parameters with this decay (e.g.
                                # 0.999) in the optimizer state, evaluated beside them (val_loss_ema) and
                                # exported with andrea-export --weights ema; 0 = none
    decay_steps: int = 0        # wsd: > 0: the last this many steps decay, instead of decay_fraction's (a cooldown
                                # forked from a stable-phase checkpoint: train.py --fork-from)
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1   # gpt2: on matrices (kernels, embeddings) only; llama: kernels, head, final norm
                                # (train/optim.decay_mask)
    clip_norm: float = 1.0      # global-norm gradient clipping
    skip_nonfinite: bool = False  # skip an update whose gradient is not finite (counted as skipped_updates) instead of
                                  # stopping the run; off: a NaN is a bug to see
    max_consecutive_skips: int = 10  # skip_nonfinite: stop after this many skipped updates in a row (a stuck run; a
                                     # spike skips a few)
    z_loss: float = 0.0         # coefficient of mean(log Z)^2 added to the training loss (PaLM: 1e-4); logged as
                                # z_loss, not in loss
    skip_spikes: float = 0.0    # > 0: an update whose loss exceeds the mean of the last skip_spikes_window losses by
                                # this many standard deviations is not applied (counted as skipped_spikes); 0 = off
    skip_spikes_window: int = 100  # the recent (applied) losses the spike test compares with; it acts once it holds
                                   # this many
    muon_lr: float = 0.02       # muon: peak learning rate of the blocks' matrices, on optim.lr's schedule
    muon_momentum: float = 0.95  # muon: Nesterov momentum of the matrices' gradients
    muon_weight_decay: float = 0.0  # muon: decoupled decay of the matrices, times muon_lr as AdamW's is times lr

    def check(self) -> None:
        one_of("optim.name", self.name, OPTIMIZERS, "optimizer")
        for name in ("lr", "muon_lr"):
            need(getattr(self, name) > 0 and math.isfinite(getattr(self, name)), f"optim.{name}",
                 f"must be positive, got {getattr(self, name)}")
        need(self.schedule in ("cosine", "wsd"), "optim.schedule", f"must be cosine or wsd, got {self.schedule!r}")
        need(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        need(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        need(0 < self.decay_fraction <= 1, "optim.decay_fraction", f"must be in (0, 1], got {self.decay_fraction}")
        need(0 <= self.ema < 1, "optim.ema", f"must be in [0, 1) (0 = no moving average), got {self.ema}")
        need(self.decay_steps >= 0, "optim.decay_steps",
             f"must be >= 0 (0 = optim.decay_fraction's), got {self.decay_steps}")
        need(not self.decay_steps or self.schedule == "wsd", "optim.decay_steps",
             f"is for optim.schedule=wsd, not {self.schedule}")
        for name in ("b1", "b2", "muon_momentum"):
            need(0 <= getattr(self, name) < 1, f"optim.{name}", f"must be in [0, 1), got {getattr(self, name)}")
        positive("optim", self, "eps", "clip_norm", "max_consecutive_skips")
        for name in ("weight_decay", "muon_weight_decay"):
            need(getattr(self, name) >= 0, f"optim.{name}", f"must be >= 0, got {getattr(self, name)}")
        need(self.z_loss >= 0 and math.isfinite(self.z_loss), "optim.z_loss", f"must be >= 0, got {self.z_loss}")
        need(self.skip_spikes >= 0 and math.isfinite(self.skip_spikes), "optim.skip_spikes",
             f"must be >= 0 (standard deviations; 0 = off), got {self.skip_spikes}")
        need(self.skip_spikes_window >= 2, "optim.skip_spikes_window",
             f"must be >= 2 (a standard deviation needs two losses), got {self.skip_spikes_window}")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100_000        # total optimizer updates; with train.tokens or train.flops, the budget's, resolved once
                                # at the run's start (andrea_jax/train/budget.py) and recorded in config.json
    tokens: int = 0             # > 0: train for this many tokens instead: steps = ceil(tokens / (batch_size x seq_len))
    flops: float = 0.0          # > 0: train for this many FLOPs instead (andrea_jax/train/mfu.py's count, the `mfu`
                                # metric's): steps = ceil(flops / (FLOPs per token x batch_size x seq_len))
    batch_size: int = 512       # global batch, in sequences
    batch_ramp: str = ""        # B@TOKENS,B@TOKENS,...: global batches of B sequences until TOKENS tokens have been
                                # seen, then the next stage, then train.batch_size (e.g. 128@1e9,256@2e9 for 512);
                                # turns on the token clock of every schedule (docs/RAMPS.md); "" = off
    seed: int = 0               # seeds init and sampling, and the data order unless train.data_seed is set
    data_seed: int = -1         # seeds the data order (the loader's shuffle) alone; -1 = train.seed's
    log_every: int = 10         # steps between metric lines (each costs one host sync)
    eval_every: int = 1000      # steps between validation passes; 0 = only at the end
    eval_batches: int = 8       # validation batches per pass (the set itself is fixed)
    eval_tasks: str = ""        # comma-separated task files (.jsonl, as `evaluate --task`) scored at every evaluation:
                                # task/NAME/METRIC
    sample_tokens: int = 0      # tokens of text generated at the end of the run (0 = none)
    checkpoint_every: int = 1000  # steps between Orbax checkpoints (and at the end); 0 = none, no resume
    keep_checkpoints: int = 3   # newest checkpoints kept on disk
    microbatches: int = 1       # gradient accumulation: each batch runs as this many equal slices, one update (memory
                                # of one slice)
    init_from: str = ""         # a transformers GPT-2 or Llama folder a new run starts from (fresh optimizer, step 0);
                                # empty = random init
    profile: str = ""           # START:END: a jax.profiler trace of steps START..END in WORKDIR/profile (TensorBoard,
                                # Perfetto)
    compile_cache: bool = True  # XLA's persistent compilation cache in $ANDREA_CACHE/xla (unless
                                # JAX_COMPILATION_CACHE_DIR is set)
    peak_tflops: float = 0.0    # per chip, for the metric lines' `mfu`; 0 = the device kind's (andrea_jax/train/mfu.py;
                                # none on a CPU)
    fork_from: str = ""         # RUN@STEP: the stable-phase checkpoint this run was forked from (train.py --fork-from
                                # records it; never set by hand)
    deterministic: bool = False  # bitwise-repeatable GPU steps: XLA's deterministic kernels, no autotuning
                                 # (startup.DETERMINISTIC_XLA_FLAGS, set by train.py before jax starts); slower

    def check(self) -> None:
        positive("train", self, "steps", "batch_size", "log_every", "eval_batches", "keep_checkpoints",
                 "microbatches")
        for name in ("eval_every", "sample_tokens", "checkpoint_every"):
            need(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(self, name)}")
        need(self.batch_size % self.microbatches == 0, "train.microbatches",
             f"{self.microbatches} does not divide train.batch_size={self.batch_size}")
        start, sep, end = self.profile.partition(":")
        need(not self.profile or (sep and start.isdigit() and end.isdigit() and 0 < int(start) <= int(end)),
             "train.profile", f"must be START:END with 0 < START <= END, got {self.profile!r}")
        need(self.peak_tflops >= 0, "train.peak_tflops", f"must be >= 0, got {self.peak_tflops}")
        need(self.tokens >= 0, "train.tokens", f"must be >= 0 (0 = train.steps sets the length), got {self.tokens}")
        need(self.flops >= 0 and math.isfinite(self.flops), "train.flops",
             f"must be >= 0 (0 = train.steps sets the length), got {self.flops}")
        need(not (self.tokens and self.flops), "train.flops",
             f"set only one of train.steps, train.tokens and train.flops; train.tokens={self.tokens} is set too")
        need(self.data_seed >= -1, "train.data_seed", f"must be >= 0, or -1 for train.seed's, got {self.data_seed}")
        for batch, _ in parse_ramp("train.batch_ramp", self.batch_ramp):
            need(batch <= self.batch_size, "train.batch_ramp",
                 f"stage batch {batch} exceeds train.batch_size={self.batch_size}")
            need(batch % self.microbatches == 0, "train.batch_ramp",
                 f"stage batch {batch} is not divisible by train.microbatches={self.microbatches}")

    @property
    def order_seed(self) -> int:
        """The data order's seed: train.data_seed, or train.seed where that is -1."""
        return self.seed if self.data_seed == -1 else self.data_seed


@dataclass(frozen=True)
class DataConfig:
    source: str = "embedded"    # embedded (shipped tinyshakespeare) | files (data.path) | tfds (data.tfds_name) |
                                # prepared (data.path)
    path: str = ""              # files: a folder (read recursively), a file or a glob of .txt / .jsonl (`text` field)
                                # files;
                                # prepared: the folder `python -m andrea_jax.data.prepare --out` wrote
    tfds_name: str = ""         # tfds: a registered TFDS text dataset (a `text` feature), e.g. lm1b or c4/en
    tfds_split: str = "train"   # tfds: the split trained on, in TFDS split syntax (e.g. train[:10%])
    tfds_val_split: str = ""    # tfds: the split validated on (e.g. test); empty = the val_fraction tail of training
    tfds_download: bool = True  # tfds: download and prepare the dataset when data_dir lacks it (c4: hundreds of GB)
    data_dir: str = ""          # TFDS data_dir; empty = $ANDREA_CACHE/tfds (embedded, files) or TFDS's default (tfds)
    val_fraction: float = 0.05  # tail of the token stream held out as the fixed validation set (no tfds_val_split)
    tokenizer: str = ""         # path of a tokenizer.json to use; empty = train on the corpus (cached beside it)
    tokenizer_sample_mb: int = 64  # a trained tokenizer sees a seeded uniform sample of about this much of the
                                   # documents
    document_mask: bool = False  # attention of a packed row stays within each document (one starts after each
                                 # <|endoftext|>), in training and its validation; generation is unchanged
    mixture: str = ""           # prepared: PATH:WEIGHT,PATH:WEIGHT,... prepared datasets (same tokenizer) mixed
                                # window by window in these proportions (normalised); replaces data.path

    def check(self) -> None:
        d = self
        one_of("data.source", d.source, ("embedded", "files", "tfds", "prepared"), "source")
        need(d.source != "files" or bool(d.path), "data.path",
             "data.source=files needs a folder, file or glob of .txt / .jsonl files")
        need(d.source != "prepared" or bool(d.path) or bool(d.mixture), "data.path",
             "data.source=prepared needs the folder written by python -m andrea_jax.data.prepare")
        need(d.source == "prepared" or not d.mixture, "data.mixture",
             f"is only read with data.source=prepared, not {d.source!r}")
        need(not (d.path and d.mixture), "data.path", "is replaced by data.mixture's paths: set one of them")
        parse_mixture(d.mixture)
        need(d.source in ("files", "prepared") or not d.path, "data.path",
             f"is only read with data.source=files or prepared, not {d.source!r}")
        need(d.source != "tfds" or bool(d.tfds_name), "data.tfds_name",
             "data.source=tfds needs a TFDS dataset name, e.g. lm1b or c4/en")
        for key, value in (("data.tfds_name", d.tfds_name), ("data.tfds_val_split", d.tfds_val_split)):
            need(d.source == "tfds" or not value, key, f"is only read with data.source=tfds, not {d.source!r}")
        need(d.source != "tfds" or bool(d.tfds_split), "data.tfds_split", "must name the split to train on")
        need(0 < d.val_fraction < 1, "data.val_fraction", f"must be in (0, 1), got {d.val_fraction}")
        positive("data", d, "tokenizer_sample_mb")


@dataclass(frozen=True)
class DiagnosticsConfig:
    every: int = 0              # steps between per-layer diagnostics (RMS, branch ratios, grad norms); 0 = off
    spike_window: int = 1000    # loss-spike score: previous steps in the rolling mean/std (OLMo 2: 1000)
    spike_sigmas: float = 6.0   # loss-spike score: a spike is a loss above rolling mean + this many stds
    tensorboard: bool = True    # also write every metric line as TensorBoard events under WORKDIR/tb
    wandb: str = ""             # a Weights & Biases project: every metric line, the config and the tags go there too
                                # (extra `wandb`)
    wandb_tags: str = ""        # wandb: comma-separated tags, besides family=, norm=, prores= and scale_updates= of the
                                # run
    knockout: bool = False      # at each evaluation, the validation-loss change with each block's alpha set to 0
                                # (`knockout`, [L])
    knockout_chunk: int = 1     # knockout: masks per vmapped pass (lax.map over chunks; 1 is the fastest on CPU); 0 =
                                # all L

    def check(self) -> None:
        need(self.every >= 0, "diagnostics.every", f"must be >= 0, got {self.every}")
        need(self.spike_window >= 2, "diagnostics.spike_window", f"must be >= 2, got {self.spike_window}")
        positive("diagnostics", self, "spike_sigmas")
        need(self.knockout_chunk >= 0, "diagnostics.knockout_chunk", f"must be >= 0, got {self.knockout_chunk}")


@dataclass(frozen=True)
class KernelsConfig:
    impl: str = "auto"          # xla | pallas | triton | auto (xla everywhere until a GPU train-step measurement:
                                # kernels/src/__init__.py)

    def check(self) -> None:
        need(self.impl in KERNEL_IMPLS, "kernels.impl",
             f"must be {', '.join(KERNEL_IMPLS[:-1])} or {KERNEL_IMPLS[-1]}, got {self.impl!r}")


@dataclass(frozen=True)
class MeshConfig:
    # Device mesh (data x fsdp x tensor must be the device count; one entry may be -1 = the rest).
    # What each axis splits: andrea_jax.train.sharding. Defaults: plain data parallelism.
    data: int = -1              # data parallel: batch split, state replicated
    fsdp: int = 1               # fully sharded data parallel: batch split, matrices and Adam moments split on d_model
    tensor: int = 1             # tensor parallel: heads, MLP width, vocabulary split; must divide n_head and the MLP
                                # width
    rules: str = ""             # overrides of sharding.RULES, "NAME=AXIS+AXIS,NAME=" (empty after = = whole); "" = none

    def check(self) -> None:
        for key in MESH_AXES:  # the device count is checked when the mesh is made
            value = getattr(self, key)
            need(value >= 1 or value == -1, f"mesh.{key}", f"must be positive or -1 (the rest), got {value}")
        need([self.data, self.fsdp, self.tensor].count(-1) <= 1, "mesh.data", "only one mesh axis may be -1")
        parse_rules(self.rules)


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
