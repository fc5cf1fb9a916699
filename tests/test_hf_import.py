"""train.init_from: a folder that transformers itself wrote (a random GPT-2 / Llama with every
weight perturbed, so no tensor is a default) gives our model the logits transformers computes; a
run starts from those weights at step 0 with a fresh optimizer; a folder that does not fit is one
line naming what does not."""
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import config as config_lib, configs, model as model_lib
from andrea_jax.config import Config, ModelConfig
from andrea_jax.errors import LoadError
from andrea_jax.model import hf
from andrea_jax.model.transformer import FAMILIES
from andrea_jax.serve import load
from andrea_jax.train import loop as trainer

V, S, D, L, H = 300, 16, 32, 2, 4
OURS = {"gpt2": ModelConfig(vocab_size=V, seq_len=S, d_model=D, n_layer=L, n_head=H),
        "llama": ModelConfig(vocab_size=V, seq_len=S, d_model=D, n_layer=L, n_head=H, family="llama")}


def hf_folder(family, folder):
    """A transformers model of our shapes, every parameter redrawn N(0, 0.1) (seeded), saved with
    save_pretrained; returns the model."""
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=V, n_positions=S, n_embd=D, n_layer=L, n_head=H,
                                         activation_function="gelu_new", layer_norm_epsilon=1e-5)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=4 * D, num_hidden_layers=L,
                                          num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=S,
                                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 and p.shape[0] == D else 0.0))
    model.eval().save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"hf-{request.param}")
    return request.param, path, hf_folder(request.param, path)


def test_imported_weights_compute_transformers_logits(folder):
    import torch

    family, path, hf_model = folder
    params = hf.read_params(Config(model=OURS[family]), path)
    tokens = np.array(jax.random.randint(jax.random.key(0), (2, S), 0, V))
    ours = np.asarray(model_lib.Andrea(OURS[family]).apply({"params": params}, jnp.asarray(tokens), jnp.ones(L)).logits)
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens).long()).logits.numpy()
    # float32 on both sides, logits up to ~2.5: measured 1.5e-6 (gpt2), 1.2e-6 (llama)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5)
    assert np.abs(ours).max() > 1.0  # the perturbed weights give logits far from 0


def test_a_run_starts_from_the_folder_at_step_0_with_a_fresh_optimizer(folder, tmp_path, tok_path):
    family, path, _ = folder
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        f"model.family={family}", f"model.vocab_size={V}", f"model.seq_len={S}", f"model.d_model={D}",
        f"model.n_layer={L}", f"model.n_head={H}", "train.steps=1", "train.batch_size=4", "train.eval_every=0",
        "train.sample_tokens=0", "train.checkpoint_every=1", "optim.warmup_steps=10",  # step 1's LR is 0
        "prores.schedule=linear", "prores.warmup=5", f"train.init_from={path}", f"data.tokenizer={tok_path}",
        "diagnostics.tensorboard=false"]))
    trainer.train(cfg, tmp_path / "run", show_progress=False)
    restored = load.load(workdir=tmp_path / "run")
    assert restored.step == 1
    # At LR 0 the first update changes nothing: the checkpoint holds the folder's weights exactly.
    want = hf.read_params(cfg, path)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), want)


def test_a_resumed_run_continues_from_its_checkpoint_without_reading_the_folder(folder, tmp_path, tok_path):
    family, path, _ = folder
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    cfg = lambda steps: config_lib.validate(config_lib.override(configs.load("tiny"), [
        f"model.family={family}", f"model.vocab_size={V}", f"model.seq_len={S}", f"model.d_model={D}",
        f"model.n_layer={L}", f"model.n_head={H}", f"train.steps={steps}", "train.batch_size=4",
        "train.eval_every=0", "train.sample_tokens=0", "train.checkpoint_every=1", f"train.init_from={copy}",
        f"data.tokenizer={tok_path}", "diagnostics.tensorboard=false"]))
    trainer.train(cfg(1), tmp_path / "run", show_progress=False)
    shutil.rmtree(copy)   # a resume reads its checkpoint alone
    lines = trainer.train(cfg(2), tmp_path / "run", show_progress=False, allow_schedule_change=True)
    assert [l["step"] for l in lines] == [2]


def test_a_folder_that_does_not_fit_is_one_line_naming_it(folder, tmp_path):
    family, path, _ = folder
    wide = Config(model=dataclasses.replace(OURS[family], d_model=64))
    with pytest.raises(LoadError, match=r"\S+ is \[[0-9, ]*32\] there, \[[0-9, ]*64\] in the model of the config"):
        hf.read_params(wide, path)
    deeper = Config(model=dataclasses.replace(OURS[family], n_layer=3))
    with pytest.raises(LoadError, match=r"has no tensor (transformer.h|model.layers).2.* model.n_layer=3 blocks"):
        hf.read_params(deeper, path)
    other = "llama" if family == "gpt2" else "gpt2"
    with pytest.raises(LoadError, match=f"model_type '{family}' is not '{other}'"):
        hf.read_params(Config(model=OURS[other]), path)
    with pytest.raises(LoadError, match="pre-norm"):
        hf.read_params(Config(model=dataclasses.replace(OURS[family], norm="post")), path)
    config = json.loads((path / "config.json").read_text())
    eps_key = "layer_norm_epsilon" if family == "gpt2" else "rms_norm_eps"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    (odd / "config.json").write_text(json.dumps({**config, eps_key: 1e-6}))
    with pytest.raises(LoadError, match=f"{eps_key}=1e-06, the model has model.ln_eps=1e-05"):
        hf.read_params(Config(model=OURS[family]), odd)
    with pytest.raises(LoadError, match="does not exist"):
        hf.read_params(Config(model=OURS[family]), tmp_path / "nowhere")



def test_a_family_without_a_hugging_face_architecture_is_refused_both_ways(folder, monkeypatch):
    family, path, _ = folder
    monkeypatch.setattr(FAMILIES[family], "HF_ARCHITECTURE", None)
    assert hf.refusal(OURS[family]) == (f"model.family={family} has no Hugging Face architecture; "
                                        "use --format native")
    with pytest.raises(LoadError, match=f"model.family={family} has no Hugging Face architecture to read"):
        hf.read_params(Config(model=OURS[family]), path)

def test_an_export_of_a_trained_run_continues_from_its_logits_and_its_loss(trained_run, tmp_path, tok_path):
    """The project's own round trip: a trained toy run (mid-warmup: its alphas are folded into the
    export) exported with `export --format hf`, read back with init_from: transformers' logits,
    and a new run whose loss at its first step is the loss of those weights on its first batch."""
    import torch
    from andrea_jax.data import pipeline
    from andrea_jax.serve import export
    from andrea_jax.train import steps
    from test_export import hf_model

    loaded = load.load(workdir=trained_run())
    folder = export.save_hf(loaded, tmp_path / "hf")
    cfg = config_lib.validate(config_lib.override(loaded.cfg, [
        f"train.init_from={folder}", "prores.schedule=none", "train.steps=1", "train.log_every=1",
        "train.eval_every=0", "train.checkpoint_every=0", f"data.tokenizer={folder / 'tokenizer.json'}"]))
    params = hf.read_params(cfg, folder)
    tokens = np.array(jax.random.randint(jax.random.key(0), (2, 32), 0, cfg.model.vocab_size))
    ours = np.asarray(model_lib.Andrea(cfg.model).apply({"params": params}, jnp.asarray(tokens), jnp.ones(3)).logits)
    with torch.no_grad():
        theirs = hf_model(folder)(torch.from_numpy(tokens).long()).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)  # the bound; measured 1.8e-7

    lines = trainer.train(cfg, tmp_path / "run", show_progress=False)
    (tmp_path / "again").mkdir()
    _, batches, _ = pipeline.build(cfg, tmp_path / "again")  # the trainer's first batch, as it drew it
    model = model_lib.Andrea(cfg.model, padded_logits=True)
    want = float(steps.loss_fn(params, model, jnp.asarray(next(batches)), jnp.ones(3)))
    # the jitted step against an eager forward of the same weights: measured 8.7e-8 relative
    assert lines[0]["step"] == 1 and lines[0]["loss"] == pytest.approx(want, rel=1e-6)
