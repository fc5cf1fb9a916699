"""Where metric lines go: WORKDIR/metrics.jsonl, TensorBoard, Weights & Biases
(diagnostics.wandb), and the per-step losses.

Written by process 0 only. On a resumed run the lines and losses of steps after the restored
checkpoint are dropped, so the files read as one uninterrupted run.
"""
from __future__ import annotations

import json
import secrets
import sys

import jax
import numpy as np

from andrea_jax.config import Config
from andrea_jax.errors import MissingExtraError, is_missing
from andrea_jax.workdir import Workdir


def metric_line(step: int, metrics) -> dict:
    """Host values of one step's metrics: floats, and lists of floats for per-layer arrays."""
    host = jax.device_get(metrics)
    return {"step": step, **{k: float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]
                             for k, v in host.items()}}


def _tensorboard(cfg: Config, run_dir: Workdir):
    if not cfg.diagnostics.tensorboard or jax.process_index() != 0:
        return None
    return summary_writer_class()(str(run_dir.tensorboard))


# What tensorboardX imports at its own import where installed, only to accept their tensors (torch) or
# to write to a bucket (google-cloud-storage, boto3). A run's event files are local and its metrics
# Python floats: none is needed, and importing them is a large part of a short run's start.
_PROBED_BY_TENSORBOARDX = ("torch", "google.cloud.storage", "boto3")


def summary_writer_class():
    """tensorboardX's SummaryWriter, imported only when used, with its probes shown none of the
    packages above that are not loaded already; they import as usual afterwards."""
    if "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    hidden = [name for name in _PROBED_BY_TENSORBOARDX if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError while this entry stands
    try:
        from tensorboardX import SummaryWriter
    finally:
        for name in hidden:
            del sys.modules[name]
    return SummaryWriter


def scalars(line: dict) -> dict:
    """A metric line's values as named scalars: per-layer lists as NAME/layer_LLL (1-based) plus
    NAME/max; `step` left out."""
    out = {}
    for key, value in line.items():
        if key == "step":
            continue
        if isinstance(value, list):
            out |= {f"{key}/layer_{l:03d}": v for l, v in enumerate(value, start=1)}
            out[f"{key}/max"] = max(value)
        else:
            out[key] = value
    return out


def write_tensorboard(writer, line: dict) -> None:
    for tag, value in scalars(line).items():
        writer.add_scalar(tag, value, line["step"])


def import_wandb():
    try:
        import wandb
    except ImportError as err:
        if not is_missing(err, "wandb"):
            raise
        raise MissingExtraError("diagnostics.wandb", "wandb") from None
    return wandb


def wandb_tags(cfg: Config) -> list[str]:
    own = [t.strip() for t in cfg.diagnostics.wandb_tags.split(",") if t.strip()]
    return own + [f"family={cfg.model.family}", f"norm={cfg.model.norm}", f"prores={cfg.prores.schedule}",
                  f"scale_updates={cfg.prores.scale_updates}"]


def _wandb_run(cfg: Config, run_dir: Workdir):
    """A W&B run named after the workdir, with the resolved config and the tags; its id is kept in
    the workdir, so a resumed run logs into the same W&B run (WANDB_MODE=offline works too)."""
    if not cfg.diagnostics.wandb or jax.process_index() != 0:
        return None
    wandb = import_wandb()
    run_id = run_dir.wandb_id.read_text().strip() if run_dir.wandb_id.is_file() else secrets.token_hex(4)
    run_dir.wandb_id.write_text(run_id + "\n")
    return wandb.init(project=cfg.diagnostics.wandb, dir=str(run_dir.root), name=run_dir.root.name, id=run_id,
                      resume="allow", config=cfg.to_dict(), tags=wandb_tags(cfg))


class MetricsLog:
    """metrics.jsonl, TensorBoard and `step_losses` (every step's loss, aligned with its step)."""

    def __init__(self, cfg: Config, run_dir: Workdir, start_step: int, step_losses: list[float]):
        self.active = jax.process_index() == 0
        self.lines_path, self.losses_path = run_dir.metrics, run_dir.step_losses
        kept, self.step_losses = [], list(step_losses)  # the restored checkpoint's: aligned with its step
        if start_step and self.active and self.lines_path.exists():
            kept = [l for l in self.lines_path.read_text().splitlines()
                    if l.strip() and json.loads(l)["step"] <= start_step]
        self.file = self.lines_path.open("w") if self.active else None
        if self.file:
            self.file.writelines(l + "\n" for l in kept)
        self.writer = _tensorboard(cfg, run_dir)
        self.wandb = _wandb_run(cfg, run_dir)

    def write(self, line: dict) -> None:
        if self.file:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()
        if self.writer is not None:
            write_tensorboard(self.writer, line)
        if self.wandb is not None:
            self.wandb.log(scalars(line), step=line["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
            np.save(self.losses_path, np.asarray(self.step_losses, np.float32))
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
