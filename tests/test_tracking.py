"""diagnostics.wandb in W&B's offline mode: the run's local files (read here without wandb's
code, as the LevelDB-style log of protobuf records W&B writes) hold every metric line, per-layer
lists as NAME/layer_LLL, the resolved config and the tags; a resumed run logs into the same W&B
run."""
import json
import struct

from andrea_jax import config as config_lib, configs
from andrea_jax.train import loop as trainer

BLOCK, HEADER = 32768, 7  # W&B's log: 32 KiB blocks of records [crc32, length u16, type u8, data]
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path):
    """The protobuf records of a .wandb file, reassembled across blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending, out = path.read_bytes(), HEADER, b"", []
    assert data[:4] == b":W&B"
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + HEADER:pos + HEADER + n], pos + HEADER + n
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def read_offline_run(workdir):
    """(run id, tags, config, [history rows]) of each offline run under workdir/wandb."""
    runs = []
    for path in sorted((workdir / "wandb").glob("offline-run-*/run-*.wandb")):
        tags, config, rows, run_id = [], {}, [], None
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run_id, tags = r.run.run_id, list(r.run.tags)
                config |= {i.key: json.loads(i.value_json) for i in r.run.config.update}
            elif kind == "config":
                config |= {i.key: json.loads(i.value_json) for i in r.config.update}
            elif kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        runs.append((run_id, tags, config, rows))
    return runs


def test_wandb_offline_holds_every_metric_line_the_config_and_the_tags(tmp_path, tok_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.seq_len=16", "model.vocab_size=300",
        f"data.tokenizer={tok_path}", "train.steps=4", "train.batch_size=4", "train.log_every=2",
        "train.eval_every=4", "train.eval_batches=1", "train.sample_tokens=0", "train.checkpoint_every=4",
        "prores.schedule=linear", "prores.warmup=2", "diagnostics.every=2", "diagnostics.tensorboard=false",
        "diagnostics.wandb=andrea-tests", "diagnostics.wandb_tags=toy,ci"]))
    trainer.train(cfg, tmp_path, show_progress=False)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [(run_id, tags, config, rows)] = read_offline_run(tmp_path)
    assert run_id == (tmp_path / "wandb_id").read_text().strip()
    assert tags == ["toy", "ci", "family=gpt2", "norm=pre", "prores=linear", "scale_updates=none"]
    assert {k: v for k, v in config.items() if k != "_wandb"} == cfg.to_dict()
    assert [r["_step"] for r in rows] == [l["step"] for l in lines] == [1, 2, 4]
    for row, line in zip(rows, lines):
        for key, value in line.items():
            if isinstance(value, list):  # per layer, as TensorBoard has them
                assert [row[f"{key}/layer_{l:03d}"] for l in (1, 2)] == value and row[f"{key}/max"] == max(value)
            elif key != "step":
                assert row[key] == value, key
    assert "val_loss" in rows[-1] and "alpha/layer_002" in rows[0]

    # Resumed (the schedule stretched to 6 steps): the same W&B run id, a second offline segment.
    longer = config_lib.override(cfg, ["train.steps=6"])
    trainer.train(longer, tmp_path, show_progress=False, allow_schedule_change=True)
    runs = read_offline_run(tmp_path)
    assert [r[0] for r in runs] == [run_id, run_id]
    assert [r["_step"] for r in runs[1][3]] == [6]
