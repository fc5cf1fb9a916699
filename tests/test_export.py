"""Exports: the Hugging Face GPT-2 checkpoint computes our model in transformers (logits, tokenizer,
greedy generation), refused placements write nothing, native exports round-trip bit-exactly for
every placement, and the command line runs end to end."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _helpers import run_module
from andrea_jax import config as config_lib, configs, model as model_lib
from andrea_jax.model import hf
from andrea_jax.serve import export, load
from andrea_jax.data import tokenizer as tokenizer_lib

HF_RUNS = {"pre": (), "gates": ("model.gates=learned",), "lns": ("model.norm=lns",)}
TEXT = "Héllo, wörld — 日本語 ✓\n"


@pytest.fixture(scope="module")
def hf_export(trained_run, tmp_path_factory):
    """name -> (LoadedModel, folder of its hf export), each run trained and exported once."""
    made = {}

    def make(name):
        if name not in made:
            loaded = load.load(workdir=trained_run(*HF_RUNS[name]))
            made[name] = loaded, export.save_hf(loaded, tmp_path_factory.mktemp(f"hf-{name}"))
        return made[name]

    return make


def jax_logits(loaded, tokens, alphas=None):
    alphas = loaded.alphas() if alphas is None else alphas
    return np.array(loaded.model("xla").apply({"params": loaded.params}, jnp.asarray(tokens), alphas).logits)


def hf_model(folder):
    from transformers import GPT2LMHeadModel

    model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


@pytest.mark.parametrize("name", list(HF_RUNS))
def test_hf_logits_match_the_jax_model(hf_export, name):
    import torch

    loaded, folder = hf_export(name)
    alphas = np.asarray(hf.folded_alphas(loaded.cfg, loaded.step, hf.flatten_params(loaded.params)))
    # The fold must matter: mid-warmup alphas (and trained gates, which start at 0) are not all 1.
    np.testing.assert_allclose(np.asarray(loaded.alphas()), [1.0, 0.75, 0.5])
    if name == "gates":
        gates = np.asarray(loaded.params["blocks"]["residual_gate"])
        assert np.all(gates != 0) and not np.allclose(alphas, loaded.alphas())
    assert json.loads((folder / "config.json").read_text())["andrea"]["folded_alphas"] == pytest.approx(alphas)

    tokens = np.array(jax.random.randint(jax.random.key(0), (2, 32), 0, loaded.cfg.model.vocab_size))
    ours = jax_logits(loaded, tokens)
    with torch.no_grad():
        theirs = hf_model(folder)(torch.from_numpy(tokens).long()).logits.numpy()
    diff = float(np.abs(theirs - ours).max())
    print(f"{name}: max |logit difference| = {diff:.3g}")
    assert diff < 1e-4
    unfolded = jax_logits(loaded, tokens, jnp.ones_like(loaded.alphas()))
    assert np.abs(unfolded - ours).max() > 100 * max(diff, 1e-6)  # 1e-4 would catch a missing fold


def test_hf_tokenizer_gives_our_ids(hf_export):
    from transformers import AutoTokenizer

    loaded, folder = hf_export("pre")
    tok = AutoTokenizer.from_pretrained(folder)
    ids = loaded.tokenizer.encode(TEXT).ids
    assert tok(TEXT)["input_ids"] == ids  # no BOS, no prefix space
    assert tok.decode(ids) == TEXT
    eot = tokenizer_lib.eot_id(loaded.tokenizer)
    assert eot == 0 and tok.eos_token_id == tok.bos_token_id == eot
    assert tok.convert_ids_to_tokens(eot) == tokenizer_lib.EOT


def greedy_forward(loaded, prompt, n, eot=0):
    """Greedy decoding by full forward passes, never choosing EOT (as min_new_tokens does).
    The window is padded to seq_len (causal: padding after the last token changes nothing), so
    one compilation serves every step."""
    S, model = loaded.cfg.model.seq_len, loaded.model("xla")
    forward = jax.jit(lambda window: model.apply({"params": loaded.params}, window[None], loaded.alphas()).logits[0])
    ids = list(prompt)
    for _ in range(n):
        logits = np.array(forward(jnp.asarray(ids + [0] * (S - len(ids)), jnp.int32))[len(ids) - 1])
        logits[eot] = -np.inf
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def hf_greedy(folder, prompt, n):
    """transformers' own greedy generate; min_new_tokens keeps it from stopping at EOT."""
    import torch

    out = hf_model(folder).generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


def test_hf_greedy_generate_matches_a_forward_loop(hf_export):
    loaded, folder = hf_export("pre")
    prompt = loaded.tokenizer.encode("ROMEO: What").ids
    assert 2 <= len(prompt) <= 12
    theirs = hf_greedy(folder, prompt, 20)
    assert len(theirs) == 20 and theirs == greedy_forward(loaded, prompt, 20)


def test_hf_greedy_generate_matches_andrea_generate(hf_export):
    from andrea_jax.serve import generate

    loaded, folder = hf_export("pre")
    prompt = loaded.tokenizer.encode("ROMEO: What").ids
    [ours] = generate.generate(loaded, [prompt], max_new_tokens=20, temperature=0.0, stop_at_eot=False)
    assert len(ours) == 20
    # Ours may choose EOT where transformers, held by min_new_tokens, may not: equal up to it.
    k = ours.index(0) if 0 in ours else len(ours)
    assert hf_greedy(folder, prompt, 20)[:k] == ours[:k] and k > 0


def init_loaded(tok_path, *overrides, step=7):
    """A LoadedModel of the toy's shapes with random values in every parameter (no training)."""
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=3", "model.d_model=32", "model.n_head=4", "model.seq_len=32",
        "model.vocab_size=300", "prores.schedule=linear", "prores.warmup=4", *overrides]))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), model_lib.param_shapes(cfg.model))
    return load.LoadedModel(cfg, params, tokenizer_lib.load(tok_path), step, "random")


@pytest.mark.parametrize("norm", ["post", "sandwich", "deepnorm"])
def test_hf_refuses_placements_gpt2_cannot_express(tok_path, tmp_path, norm):
    loaded = init_loaded(tok_path, f"model.norm={norm}")
    out = tmp_path / "out"
    with pytest.raises(export.ExportError, match=rf"model.norm={norm}.*pre-norm.*--format native"):
        export.save_hf(loaded, out)
    assert not out.exists()


NATIVE_CASES = [(f"model.norm={n}",) for n in config_lib.NORMS] + [("model.gates=learned",)]


@pytest.mark.parametrize("overrides", NATIVE_CASES, ids=lambda o: o[0].split("=")[1])
def test_native_round_trips_bit_exactly(tok_path, tmp_path, overrides):
    loaded = init_loaded(tok_path, *overrides)
    export.export(loaded, tmp_path, "native")
    back = load.load(export=tmp_path)
    assert back.cfg == loaded.cfg and back.step == loaded.step
    flat, flat_back = hf.flatten_params(loaded.params), hf.flatten_params(back.params)
    assert set(flat) == set(flat_back)
    for name in flat:
        assert flat_back[name].dtype == np.float32 and np.array_equal(flat_back[name], flat[name]), name
    assert back.tokenizer.encode(TEXT).ids == loaded.tokenizer.encode(TEXT).ids



def test_a_tampered_native_export_is_refused_in_one_line_that_says_why(tok_path, tmp_path):
    import re
    import shutil
    from safetensors.numpy import load_file, save_file
    good = export.export(init_loaded(tok_path), tmp_path / "good", "native")

    def tampered(name, change):
        path = tmp_path / name
        shutil.copytree(good, path)
        change(path)
        return path

    def edit_config(**changes):
        def change(path):
            meta = json.loads((path / "config.json").read_text())
            (path / "config.json").write_text(json.dumps({**meta, **changes}))
        return change

    def edit_tensors(change):
        def write(path):
            flat = load_file(str(path / "model.safetensors"))
            change(flat)
            save_file(flat, str(path / "model.safetensors"))
        return write

    cases = {
        "old_format": (edit_config(format="andrea-native-0"), "{p}: not a native export of andrea_jax"),
        "hf": (edit_config(format=None, model_type="gpt2"),
               "{p}: not a native export of andrea_jax (a Hugging Face export: load it with transformers)"),
        "not_json": (lambda p: (p / "config.json").write_text("{"), "{p}/config.json: not JSON (.*)"),
        "no_tokenizer": (lambda p: (p / "tokenizer.json").unlink(),
                         "{p}/tokenizer.json: missing; {p} is not a native export of andrea_jax"),
        "newer_config": (edit_config(config={**json.loads((good / "config.json").read_text())["config"], "gpu": {}}),
                         "{p}/config.json: not a config of this version of andrea_jax (.*)"),
        "damaged": (lambda p: (p / "model.safetensors").write_bytes(b"garbage"),
                    "{p}/model.safetensors: cannot be read (.*)"),
        "a_shape": (edit_tensors(lambda f: f.update(lnf_bias=f["lnf_bias"][:-1])),
                    "{p}/model.safetensors: its tensors do not match the model its config describes"),
        "a_tensor_less": (edit_tensors(lambda f: f.pop("lnf_bias")),
                          "{p}/model.safetensors: its tensors do not match the model its config describes"),
    }
    for name, (change, message) in cases.items():
        path = tampered(name, change)
        with pytest.raises(load.LoadError) as err:
            load.load(export=path)
        assert re.fullmatch(re.escape(message.format(p=path)).replace(re.escape("(.*)"), r"\(.*\)"),
                            str(err.value)), (name, str(err.value))
    for extra in ({"step": 3}, {"weights": "ema"}):
        with pytest.raises(load.LoadError, match=rf"^{good}: an export holds one set of weights; --step and --weights"):
            load.load(export=good, **extra)
    with pytest.raises(ValueError, match="^give exactly one of workdir or export$"):
        load.load(workdir=tmp_path, export=good)
    assert load.load(export=good).step == 7
    from safetensors import safe_open
    with safe_open(str(good / "model.safetensors"), "numpy") as f:   # for readers other than ours
        assert f.metadata() == {"format": "andrea-native-1", "step": "7"}


def test_cli_writes_an_hf_export(trained_run, tmp_path):
    out = tmp_path / "hf"
    proc = run_module("andrea_jax.serve.export", "--workdir", trained_run(), "--out", out, "--step", 3)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout and "step 3" in proc.stdout
    assert {p.name for p in out.iterdir()} == set(export.HF_FILES)
    assert json.loads((out / "config.json").read_text())["andrea"]["step"] == 3
    assert not any(p.suffix in (".bin", ".pt", ".pkl", ".pickle") for p in out.iterdir())


def test_cli_errors_are_one_line(tok_path, tmp_path):
    missing = tmp_path / "no-such-run"
    proc = run_module("andrea_jax.serve.export", "--workdir", missing, "--out", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: ") and str(missing) in proc.stderr
    # A refused placement, from a native export of it: fails before writing anything.
    native = export.export(init_loaded(tok_path, "model.norm=post"), tmp_path / "native", "native")
    proc = run_module("andrea_jax.serve.export", "--export", native, "--out", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--format native" in proc.stderr
    assert not (tmp_path / "out").exists()
