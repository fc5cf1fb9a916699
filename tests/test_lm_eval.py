"""The lm-evaluation-harness model `andrea`: its scores equal the project's own scorer and
lm-eval's definitions, and lm_eval's command line runs it (offline)."""
import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before lm_eval imports datasets: nothing may reach the hub

import pathlib
import sys
import types

import jax
import numpy as np
import lm_eval.__main__
import pytest
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.model import CacheHook, TemplateLM
from lm_eval.tasks import TaskManager
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from _helpers import forward_logits, run_module
from andrea_jax.serve import generate, lm_eval_adapter as adapter, scoring, tasks
from andrea_jax.data import tokenizer as tok_lib
from andrea_jax.serve.lm_eval_adapter import AndreaLM, cut_at_stop

REPO = pathlib.Path(__file__).resolve().parent.parent
TASKS = REPO / "tasks"
SEQ_LEN = 32


@pytest.fixture(scope="module")
def lm(trained_run):
    return AndreaLM(workdir=str(trained_run()), batch_size=16)


def forward_logprobs(loaded, ids):
    """log p(ids[i] | ids[:i]) for i >= 1 from one plain forward pass (right-padded: one compile)."""
    ids = np.asarray(ids, np.int32)
    n = len(ids) - 1
    padded = np.zeros((1, SEQ_LEN), np.int32)
    padded[0, :n] = ids[:-1]
    logits = forward_logits(loaded.model("xla"), loaded.params, padded, loaded.alphas())
    logp = np.asarray(jax.nn.log_softmax(logits[0, :n].astype(np.float32), axis=-1))
    return logp[np.arange(n), ids[1:]]


def test_local_tasks_score_every_request_as_the_project_and_a_plain_forward_pass(lm):
    """lm-eval's own requests and per-request log-likelihoods (log_samples), request by request:
    the requests are those of our task files, and each score is the project's scorer's and the
    sum of a plain forward pass's log-probabilities of the continuation."""
    out = simple_evaluate(model=lm, tasks=["andrea_shakespeare_mc", "andrea_shakespeare_lambada"],
                          task_manager=TaskManager(include_path=str(TASKS / "lm_eval")),
                          bootstrap_iters=0, log_samples=True)
    for task, path in (("andrea_shakespeare_mc", "shakespeare_mc.jsonl"),
                       ("andrea_shakespeare_lambada", "shakespeare_lambada.jsonl")):
        examples = tasks.read_task(TASKS / path)
        samples = sorted(out["samples"][task], key=lambda sample: sample["doc_id"])
        assert [s["doc_id"] for s in samples] == list(range(len(examples)))
        requests = [ex.requests() if isinstance(ex, tasks.ChoiceExample) else [(ex.context, ex.target)]
                    for ex in examples]
        assert [[tuple(a) for a in s["arguments"]] for s in samples] == requests, task
        flat = [r for rs in requests for r in rs]
        got = [tuple(resp[0]) for s in samples for resp in s["resps"]]  # (log-likelihood, is greedy)
        ours = scoring.loglikelihood(lm.loaded, flat)
        assert [greedy for _, greedy in got] == [greedy for _, greedy in ours]
        # The adapter returns scoring.loglikelihood's floats, but lm-eval hands it both tasks'
        # requests in batches of 16 where this call scores one task's in batches of 32: other
        # batch shapes. Measured bit-equal natively, AVX2, SSE4_2; allowed: the bound of the plain
        # forward's other batch shape below.
        np.testing.assert_allclose([ll for ll, _ in got], [ll for ll, _ in ours], rtol=0, atol=2e-5)
        plain = []
        for context, continuation in flat:
            ctx, cont = scoring.encode_pair(lm.loaded.tokenizer, context, continuation)
            window = (ctx + cont)[-(SEQ_LEN + 1):]  # a long context keeps its last tokens (lm-eval's HFLM too)
            plain.append(forward_logprobs(lm.loaded, window)[-len(cont):].sum(dtype=np.float64))
        # measured max |difference| 1.9e-6 (128 choices, log-likelihoods down to -158.5 nats) and
        # 9.5e-7 (34 last words, down to -38.4): one right-padded forward of 32 tokens against the
        # scorer's bucketed batches, float32 rounding (the same natively, AVX2, SSE4_2)
        np.testing.assert_allclose([ll for ll, _ in got], plain, rtol=0, atol=2e-5)
        assert len(set(np.round(plain, 3))) > len(plain) // 2  # distinct scores: a mix-up would show
    # The per-document metrics lm-eval derives from those scores are the project's definitions.
    mc = sorted(out["samples"]["andrea_shakespeare_mc"], key=lambda sample: sample["doc_id"])
    examples = tasks.read_task(TASKS / "shakespeare_mc.jsonl")
    for sample, example in zip(mc, examples):
        lls = [[ll for ll, _ in resp][0] for resp in sample["resps"]]
        metrics = tasks.multiple_choice_metrics([example], [lls])
        assert (sample["acc"], sample["acc_norm"]) == (metrics["acc"], metrics["acc_norm"])


@pytest.mark.parametrize("n_tokens, stride", [(1, 32), (32, 32), (33, 32), (100, 32), (100, 8), (70, 1), (40, 31)])
def test_rolling_windows_are_lm_evals(n_tokens, stride):
    ids = list(range(1, n_tokens + 1))
    ours = scoring.rolling_windows(ids, prefix=0, seq_len=SEQ_LEN, stride=stride)
    theirs = get_rolling_token_windows(ids, prefix_token=0, max_seq_len=SEQ_LEN, context_len=SEQ_LEN - stride + 1)
    assert [(seq.tolist(), n) for seq, n in ours] == [(inp + pred[-1:], len(pred)) for inp, pred in theirs]


def test_a_request_is_encoded_as_lm_eval_encodes_it_at_every_split(lm):
    text = "First Citizen:\nBefore we  proceed, hear me."
    tok = lm.loaded.tokenizer
    causal = types.SimpleNamespace(backend="causal", tok_encode=lambda t, **_: tok_lib.encode(tok, t))
    for k in range(1, len(text)):
        if text[:k].strip():  # lm-eval's caller turns an empty context into end-of-text (tested apart)
            assert scoring.encode_pair(tok, text[:k], text[k:]) == TemplateLM._encode_pair(causal, text[:k], text[k:])
    # Somewhere a token spans the boundary: there the continuation is not its own encoding.
    assert any(scoring.encode_pair(tok, text[:k], text[k:])[1] != tok_lib.encode(tok, text[k:])
               for k in range(1, len(text)))


def test_loglikelihood_rolling_is_the_project_scorer_and_lm_evals_definition(lm):
    texts = ["First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 2,
             "Señor ✓", "a"]
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
    tok = lm.loaded.tokenizer
    for text, ll in zip(texts, got):
        ids = tok_lib.encode(tok, text)
        assert ll == pytest.approx(-scoring.rolling_nll(lm.loaded, ids))
        # lm-eval's HFLM: disjoint rolling windows, each scored as context + continuation.
        want = 0.0
        for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                ids, prefix_token=0, max_seq_len=SEQ_LEN, context_len=1)):
            want += forward_logprobs(lm.loaded, context + continuation)[-len(continuation):].sum(dtype=np.float64)
        assert ll == pytest.approx(want)  # measured 9.6e-9 relative: float32 scores, float64 sum
    assert len(tok_lib.encode(tok, texts[0])) > 2 * SEQ_LEN  # several windows were checked


def test_generate_until_cuts_at_the_stop_string(lm):
    context = "ROMEO:\n"
    [full] = lm.generate_until([Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 12}), 0)])
    assert full  # greedy, so the same text comes back below
    stop = full[len(full) // 2]
    [cut] = lm.generate_until([Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 12}), 0)])
    assert cut == full[:full.index(stop)]
    assert stop not in cut
    assert cut_at_stop("a, b\nc", ["\n", ","]) == "a"


def test_sampling_settings_follow_gen_kwargs():
    settings, until = AndreaLM._settings({"until": "\n\n", "max_gen_toks": 7})
    assert dict(settings) == {"max_new_tokens": 7, "temperature": 0.0, "top_k": 0, "top_p": 1.0}
    assert until == ["\n\n"]
    assert dict(AndreaLM._settings({"do_sample": True})[0])["temperature"] == 1.0
    assert dict(AndreaLM._settings({"temperature": 0.7})[0])["temperature"] == 0.7
    assert dict(AndreaLM._settings({"do_sample": False, "temperature": 0.7})[0])["temperature"] == 0.0
    assert dict(AndreaLM._settings({"top_k": 5, "top_p": 0.9})[0]) == {
        "max_new_tokens": adapter.DEFAULT_MAX_GEN_TOKS, "temperature": 0.0, "top_k": 5, "top_p": 0.9}
    assert adapter.DEFAULT_MAX_GEN_TOKS == 256  # lm-eval's HF model's default


def test_lm_eval_command_line_runs_the_model(trained_run):
    proc = run_module("andrea_jax.serve.lm_eval_adapter", "--model", "andrea", "--model_args",
                      f"workdir={trained_run()}", "--batch_size", 16, "--tasks", "andrea_shakespeare_mc", "--limit", 4,
                      env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert "|andrea_shakespeare_mc|" in table.replace(" ", "") and "acc_norm" in table


def test_model_args_batch_size_step_and_length(trained_run):
    run = trained_run()
    assert [adapter._batch_size(v, 32) for v in ("auto", None, "0", "8", 4)] == [32, 32, 1, 8, 4]
    at3 = AndreaLM(workdir=str(run), step="3", batch_size="auto")
    assert (at3.loaded.step, at3.batch_size, at3.max_length, at3.eot_token_id) == (3, scoring.DEFAULT_BATCH, SEQ_LEN, 0)
    assert AndreaLM(workdir=str(run), batch_size="5").batch_size == 5
    assert cut_at_stop("a, b\nc", ["", "\n"]) == "a, b"  # an empty stop string stops nothing


class Recorder:
    def __init__(self):
        self.calls = []

    def add_partial(self, attr, req, res):
        self.calls.append((attr, req, res))


def test_every_answer_goes_to_lm_evals_cache_and_generations_keep_the_requests_order(lm):
    recorder = Recorder()
    lm.set_cache_hook(recorder)
    pairs = [("KING", " RICHARD"), ("To be", ",")]
    lls = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("Señor ✓",), 0)])
    greedy, sampled = {"until": [], "max_gen_toks": 6}, {"until": [], "max_gen_toks": 6, "temperature": 1.0}
    contexts = [("ROMEO:\n", greedy), ("JULIET:\n", sampled), ("KING:\n", greedy)]
    together = lm.generate_until([Instance("generate_until", {}, c, i) for i, c in enumerate(contexts)])
    alone = [lm.generate_until([Instance("generate_until", {}, c, 0)])[0] for c in contexts]
    assert together == alone and together[1] != together[0]  # the sampled one between the greedy two
    assert recorder.calls[:3] == [("loglikelihood", pairs[0], lls[0]), ("loglikelihood", pairs[1], lls[1]),
                                  ("loglikelihood_rolling", ("Señor ✓",), rolled[0])]
    assert sorted(recorder.calls[3:6]) == sorted(("generate_until", c, t) for c, t in zip(contexts, together))
    lm.set_cache_hook(CacheHook(None))


def test_sampling_follows_the_seed(trained_run):
    request = [Instance("generate_until", {}, ("ROMEO:\n", {"until": [], "max_gen_toks": 16, "temperature": 1.0}), 0)]
    outputs = {seed: AndreaLM(workdir=str(trained_run()), seed=seed).generate_until(request)[0] for seed in (1, 2)}
    assert outputs[1] == AndreaLM(workdir=str(trained_run()), seed=1).generate_until(request)[0]
    assert outputs[1] != outputs[2]


def test_the_projects_tasks_are_added_unless_an_include_path_is_given(monkeypatch):
    seen = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    adapter.main(["--tasks", "x"])
    adapter.main(["--tasks", "x", "--include_path", "mine"])
    adapter.main(["--tasks", "x", "--include_path=mine"])
    assert seen == [["lm_eval", "--tasks", "x", "--include_path", str(adapter.TASKS_DIR)],
                    ["lm_eval", "--tasks", "x", "--include_path", "mine"],
                    ["lm_eval", "--tasks", "x", "--include_path=mine"]]


def test_generation_stops_at_end_of_text_with_the_models_kernels_and_seed(lm, monkeypatch):
    seen = []
    monkeypatch.setattr(generate, "generate",
                        lambda loaded, prompts, **kw: (seen.append(kw), [[5, 6]] * len(prompts))[1])
    out = lm.generate_until([Instance("generate_until", {}, ("KING:\n", {"until": [], "max_gen_toks": 3}), 0)])
    assert out == [tok_lib.decode(lm.loaded.tokenizer, [5, 6])]
    assert seen == [{"max_new_tokens": 3, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": lm.seed,
                     "stop_at_eot": True, "impl": lm.impl}]
