"""andrea_jax.serve.evaluate: perplexity, bits per byte, strided windows, task scoring and the CLI, each
checked against a computation done here with a plain forward pass of the model."""
import json
import math
import pathlib

import jax
import numpy as np
import pytest

from _helpers import forward_logits, run_module
from andrea_jax import config as config_lib
from andrea_jax.config import Config, DataConfig
from andrea_jax.serve import evaluate, load, scoring, tasks
from andrea_jax.errors import ConfigError, DataError, TaskError
from andrea_jax.data import tokenizer as tok_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
SEQ_LEN = 32  # the trained_run toy's context


@pytest.fixture(scope="module")
def loaded(trained_run):
    return load.load(workdir=trained_run())


def logprobs_of(loaded, ids):
    """log p(ids[i] | ids[:i]) for i >= 1, and whether ids[i] is the argmax, from one full forward
    pass of the XLA model (right-padded to seq_len, which a causal model never sees: one compile)."""
    ids = np.asarray(ids, np.int32)
    assert 2 <= len(ids) <= SEQ_LEN + 1
    n = len(ids) - 1
    padded = np.zeros((1, SEQ_LEN), np.int32)
    padded[0, :n] = ids[:-1]
    logits = forward_logits(loaded.model("xla"), loaded.params, padded, loaded.alphas())
    logp = np.asarray(jax.nn.log_softmax(logits[0, :n].astype(np.float32), axis=-1))
    return logp[np.arange(n), ids[1:]], np.argmax(logp, axis=-1) == ids[1:]


def continuation_ll(loaded, context, continuation):
    """Summed log p and greediness of `continuation` after `context` (context has no trailing space)."""
    tok = loaded.tokenizer
    ctx = tok_lib.encode(tok, context)
    cont = tok_lib.encode(tok, context + continuation)[len(ctx):]
    logprob, greedy = logprobs_of(loaded, ctx + cont)
    return float(logprob[-len(cont):].sum()), bool(greedy[-len(cont):].all())


# Documents of the files corpus: `a` trains, `b` and `c` (non-ASCII) are the validation split.
DOCS = {
    "a.txt": ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
              "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n"),
    "b.txt": "MENENIUS:\nWhat work's, my countrymen?",
    "c.txt": "Señor Müller: ¿qué? ✓ naïve",
}


def test_perplexity_and_bits_per_byte_match_a_direct_computation(loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    ids = {name: tok_lib.encode(loaded.tokenizer, text) for name, text in DOCS.items()}
    val_docs = ["b.txt", "c.txt"]
    assert all(len(ids[n]) <= SEQ_LEN for n in val_docs)  # one window each: a plain forward scores it
    # A val_fraction whose tail is exactly documents b and c (each followed by end-of-text).
    n_total = sum(len(v) + 1 for v in ids.values())
    n_val = sum(len(ids[n]) + 1 for n in val_docs)
    files = ["data.source=files", f"data.path={folder}", f"data.val_fraction={(n_val + 0.5) / n_total}"]
    tokens = evaluate.data_tokens(loaded, files, "val")
    assert tokens.tolist() == ids["b.txt"] + [0] + ids["c.txt"] + [0]
    # Always the model's own BPE, even where the data config names no tokenizer (which would train one).
    assert evaluate.data_tokens(loaded, [*files, "data.tokenizer="], "val").tolist() == tokens.tolist()
    assert evaluate.data_tokens(loaded, files, "train").tolist() == ids["a.txt"] + [0]
    with pytest.raises(ValueError, match="split must be val or train, got 'test'"):
        evaluate.data_tokens(loaded, files, "test")

    result = scoring.score_stream(loaded, tokens)

    nll = -sum(logprobs_of(loaded, [0] + ids[n])[0].sum(dtype=np.float64) for n in val_docs)
    n_tokens = sum(len(ids[n]) for n in val_docs)
    n_bytes = sum(len(DOCS[n].encode("utf-8")) for n in val_docs)
    assert n_bytes > sum(len(DOCS[n]) for n in val_docs)  # the non-ASCII text counts bytes, not characters
    assert (result.documents, result.tokens, result.bytes) == (2, n_tokens, n_bytes)
    # The test's NLL comes from its own forward pass, summed in another order: measured 2.6e-8
    # relative on the perplexity, 4.6e-9 on bits per byte (float32 rounding).
    np.testing.assert_allclose(result.perplexity, math.exp(nll / n_tokens), rtol=1e-6)
    np.testing.assert_allclose(result.bits_per_byte, nll / math.log(2) / n_bytes, rtol=1e-6)


def test_bytes_per_token_counts_utf8_bytes(loaded):
    counts = tok_lib.bytes_per_token(loaded.tokenizer)
    assert counts[0] == 0  # end-of-text stands for no text
    for text in ("hello world", "Señor ✓ 東京", "a\n\nb"):
        assert counts[tok_lib.encode(loaded.tokenizer, text)].sum() == len(text.encode("utf-8"))


def test_split_documents_cuts_at_end_of_text():
    docs = scoring.split_documents(np.array([5, 6, 0, 7, 0, 0, 8, 9]), 0)
    assert [d.tolist() for d in docs] == [[5, 6], [7], [8, 9]]


def test_a_smaller_stride_gives_each_window_more_context(loaded):
    text = DOCS["a.txt"] * 2
    ids = tok_lib.encode(loaded.tokenizer, text)[:80]
    assert len(ids) == 80 > 2 * SEQ_LEN
    disjoint = scoring.rolling_logprobs(loaded, ids)
    strided = scoring.rolling_logprobs(loaded, ids, stride=8)
    assert disjoint.shape == strided.shape == (80,)
    # The first window (an end-of-text context) is the same; later tokens see different contexts.
    # measured bit-identical here; the two come from differently shaped batches, which XLA may tile
    # differently, so float32 rounding (1e-6 relative) is what the comparison allows
    np.testing.assert_allclose(strided[:SEQ_LEN], disjoint[:SEQ_LEN], rtol=1e-6)
    assert abs(strided.sum() - disjoint.sum()) > 1e-3
    # measured equal; rolling_nll sums 80 float32 values, the test in float64
    np.testing.assert_allclose(scoring.rolling_nll(loaded, ids, 8), -strided.sum(dtype=np.float64), rtol=1e-6)
    # Token 32 opens the second window: with disjoint windows it sees 1 token of context (lm-eval's
    # context_len=1), with stride 8 it sees seq_len - stride + 1 = 25 tokens.
    # measured bit-identical; another batch shape than the scorer's, so float32 rounding is allowed
    np.testing.assert_allclose(disjoint[32], logprobs_of(loaded, ids[31:33])[0][-1], rtol=1e-6)
    np.testing.assert_allclose(strided[32], logprobs_of(loaded, ids[32 - 25:33])[0][-1], rtol=1e-6)


def test_encode_pair_moves_trailing_spaces_into_the_continuation(loaded):
    tok = loaded.tokenizer
    assert scoring.encode_pair(tok, "To be or ", "not") == scoring.encode_pair(tok, "To be or", " not")
    ctx, cont = scoring.encode_pair(tok, "To be or", " not")
    assert ctx + cont == tok_lib.encode(tok, "To be or not")
    assert scoring.encode_pair(tok, "", "Hello")[0] == [0]  # empty context: end-of-text



def test_loglikelihood_matches_a_direct_computation(loaded):
    requests = [("ROMEO:\nBut soft", ", what light"), ("KING", " RICHARD"),
                ("To be", ","), ("x" * 200, " long context is cut from the left")]
    got = scoring.loglikelihood(loaded, requests)
    for (context, continuation), (ll, greedy) in zip(requests[:3], got[:3]):
        want_ll, want_greedy = continuation_ll(loaded, context, continuation)
        np.testing.assert_allclose(ll, want_ll, rtol=1e-6)  # measured 2.0e-8 relative (float32 sums)
        assert greedy == want_greedy
    ctx, cont = scoring.encode_pair(loaded.tokenizer, *requests[3])
    logprob, _ = logprobs_of(loaded, (ctx + cont)[-(SEQ_LEN + 1):])
    np.testing.assert_allclose(got[3][0], logprob[-len(cont):].sum(), rtol=1e-6)  # measured 1.1e-7 relative


def test_multiple_choice_acc_and_acc_norm(loaded):
    examples = [tasks.ChoiceExample("ROMEO:\nJuliet is the", ("sun.", "moon.", "a rose."), 0),
                tasks.ChoiceExample("LEAR:\nBlow, winds", ("and crack!", "rage!"), 1),
                tasks.ChoiceExample("HAMLET:\nTo be", ("or not", "and sleep"), 0)]
    lls = [[continuation_ll(loaded, ex.context, " " + c)[0] for c in ex.choices] for ex in examples]
    acc = np.mean([np.argmax(ll) == ex.label for ex, ll in zip(examples, lls)])
    acc_norm = np.mean([np.argmax(np.array(ll) / [len(c) for c in ex.choices]) == ex.label
                        for ex, ll in zip(examples, lls)])
    got = tasks.score_task(loaded, examples)
    assert got["kind"] == "multiple choice" and got["n"] == 3
    assert (got["acc"], got["acc_norm"]) == pytest.approx((acc, acc_norm))

    # Length normalisation can change the answer: the long choice loses on its sum, wins per character.
    ex = tasks.ChoiceExample("c", ("ab", "a much longer choice"), 1)
    metrics = tasks.multiple_choice_metrics([ex], [[-4.0, -10.0]])
    assert (metrics["acc"], metrics["acc_norm"]) == (0.0, 1.0)


def test_last_word_accuracy_and_perplexity(loaded):
    texts = ["ROMEO:\nWhat light breaks", "ALL:\nSpeak, speak", "CITIZEN:\nTo die than to famish"]
    examples = [tasks.LastWordExample.from_text(t) for t in texts]
    assert examples[1] == tasks.LastWordExample("ALL:\nSpeak,", " speak")
    results = [continuation_ll(loaded, t.rpartition(" ")[0], " " + t.rpartition(" ")[2]) for t in texts]
    got = tasks.score_task(loaded, examples)
    assert got["kind"] == "last word" and got["n"] == 3
    assert got["acc"] == pytest.approx(np.mean([g for _, g in results]))
    # exp of a mean of float32 log-likelihoods near -27: measured 4.8e-7 relative
    assert got["ppl"] == pytest.approx(math.exp(-np.mean([ll for ll, _ in results])), rel=5e-6)
    assert tasks.last_word_metrics([(-1.0, True), (-3.0, False)]) == {"acc": 0.5, "ppl": math.exp(2.0), "n": 2}


def test_shipped_task_files_parse():
    mc = tasks.read_task(REPO / "tasks" / "shakespeare_mc.jsonl")
    lambada = tasks.read_task(REPO / "tasks" / "shakespeare_lambada.jsonl")
    assert 20 <= len(mc) <= 40 and all(isinstance(e, tasks.ChoiceExample) and len(e.choices) == 4 for e in mc)
    assert 20 <= len(lambada) <= 40 and all(isinstance(e, tasks.LastWordExample) for e in lambada)


@pytest.mark.parametrize("line, message", [
    ('{"context": "a", "choices": ["x"], "label": 0}', "at least 2"),
    ('{"context": "a", "choices": ["x", ""], "label": 0}', "at least 2 non-empty strings"),
    ('{"context": "a", "choices": ["x", "y"], "label": 2}', "'label'"),
    ('{"context": "a", "choices": ["x", "y"], "label": -1}', "'label'.*got -1"),
    ('{"context": "a", "choices": ["x", "y"], "label": true}', "'label'.*got True"),
    ('{"context": 3, "choices": ["x", "y"], "label": 0}', "needs a string 'context'"),
    ('{"label": 0}', "needs a string 'context'"),
    ('{"text": "oneword"}', "several words"),
    ('{"text": "two words "}', "last word ends it"),
    ('{"question": "a"}', "the line has: question"),
    ('{}', "the line has: nothing"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('not json', "not valid JSON"),
])
def test_a_bad_task_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "task.jsonl"
    path.write_text('{"text": "a b"}\n\n' + line + "\n")  # the blank line is skipped, and counted
    with pytest.raises(TaskError, match=rf"task.jsonl line 3: .*{message}"):
        tasks.read_task(path)


def test_a_task_file_is_one_kind_of_example_at_least_one_and_utf8(tmp_path):
    path = tmp_path / "task.jsonl"
    path.write_text('{"text": "a b"}\n{"context": "a", "choices": ["x", "y"], "label": 0}\n')
    with pytest.raises(TaskError, match="line 2: mixes multiple-choice and LAMBADA-style lines in one file"):
        tasks.read_task(path)
    path.write_text("\n  \n")
    with pytest.raises(TaskError, match="task.jsonl: holds no examples"):
        tasks.read_task(path)
    path.write_bytes(b'{"text": "a \xff b"}\n')
    with pytest.raises(TaskError, match="task.jsonl: cannot be read"):
        tasks.read_task(path)
    path.write_text('\n{"text": "a b c"}\n\n')
    assert tasks.read_task(path) == [tasks.LastWordExample("a b", " c")]


def test_cli_prints_perplexity_and_bits_per_byte(trained_run, loaded):
    proc = run_module("andrea_jax.serve.evaluate", "--workdir", trained_run(), "--batch-size", "64")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("val split of embedded tinyshakespeare (stride 32): 1 document(s)")
    want = scoring.score_stream(loaded, evaluate.data_tokens(loaded), batch_size=64)
    assert f"perplexity {want.perplexity:.4f}" in line and f"bits per byte {want.bits_per_byte:.4f}" in line


def test_cli_scores_a_task_file(trained_run):
    proc = run_module("andrea_jax.serve.evaluate", "--workdir", trained_run(), "--task", "tasks/shakespeare_mc.jsonl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tasks/shakespeare_mc.jsonl (multiple choice, 32 examples): acc " in proc.stdout
    assert ", acc_norm " in proc.stdout


def test_an_export_scores_as_its_workdir(loaded, tmp_path, capsys):
    export = load.save_native(loaded, tmp_path / "export")
    assert evaluate.main(["--export", str(export), "--task", str(REPO / "tasks" / "shakespeare_lambada.jsonl")]) == 0
    want = tasks.score_task(loaded, tasks.read_task(REPO / "tasks" / "shakespeare_lambada.jsonl"))
    assert evaluate.format_task(REPO / "tasks" / "shakespeare_lambada.jsonl", want) in capsys.readouterr().out


def test_cli_missing_workdir_is_a_one_line_error(tmp_path):
    proc = run_module("andrea_jax.serve.evaluate", "--workdir", tmp_path / "nope")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {tmp_path / 'nope'}: no such run folder"


def test_tasks_scored_in_the_training_loop_equal_evaluate_on_the_checkpoint(trained_run):
    files = [REPO / "tasks" / "shakespeare_mc.jsonl", REPO / "tasks" / "shakespeare_lambada.jsonl"]
    workdir = trained_run("train.eval_tasks=" + ",".join(map(str, files)))
    last = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])  # the final evaluation, step 6
    restored = load.load(workdir=workdir)
    assert restored.step == last["step"] == 6
    for path in files:
        want = tasks.score_task(restored, tasks.read_task(path))  # what `evaluate --task` prints
        got = {k.split("/")[-1]: v for k, v in last.items() if k.startswith(f"task/{path.stem}/")}
        assert got and got == {k: v for k, v in want.items() if k not in ("kind", "n")}, (got, want)


def test_rolling_windows_refuse_a_stride_outside_1_to_seq_len_and_skip_an_empty_document():
    assert scoring.rolling_windows([], prefix=0, seq_len=8) == []
    for stride in (0, 9):
        with pytest.raises(ValueError, match=f"stride {stride} must be in 1..seq_len=8"):
            scoring.rolling_windows([1, 2, 3], prefix=0, seq_len=8, stride=stride)


def test_an_empty_or_blank_context_becomes_end_of_text(loaded):
    tok = loaded.tokenizer
    # spaces only: they move into the continuation and end-of-text stands for the empty context
    assert scoring.encode_pair(tok, "   ", "x") == ([0], tok_lib.encode(tok, "   x"))
    # a continuation that opens with end-of-text keeps it as the context, never twice
    assert scoring.encode_pair(tok, "", "<|endoftext|>Hello") == ([0], tok_lib.encode(tok, "Hello"))


def test_a_continuation_fits_up_to_seq_len_tokens_and_an_empty_one_is_certain(loaded):
    tok, text = loaded.tokenizer, DOCS["a.txt"] * 2
    length = {n: next(k for k in range(len(text)) if len(tok_lib.encode(tok, text[:k])) == n)
              for n in (SEQ_LEN, SEQ_LEN + 1)}   # the shortest prefix of n tokens
    (ll, _), = scoring.loglikelihood(loaded, [("", text[:length[SEQ_LEN]])])   # end-of-text + seq_len tokens
    assert math.isfinite(ll) and ll < 0
    with pytest.raises(ValueError, match=f"a continuation of {SEQ_LEN + 1} tokens does not fit"):
        scoring.loglikelihood(loaded, [("", text[:length[SEQ_LEN + 1]])])
    assert scoring.loglikelihood(loaded, [("KING", "")]) == [(0.0, True)]


def test_a_stream_scores_its_first_max_documents_and_refuses_one_without_a_document(loaded):
    tok = loaded.tokenizer
    docs = [tok_lib.encode(tok, text) for text in DOCS.values()]
    stream = np.concatenate([np.array(d + [0]) for d in docs])
    two = scoring.score_stream(loaded, stream, max_documents=2)
    assert (two.documents, two.tokens) == (2, len(docs[0]) + len(docs[1]))
    assert two.bytes == len((DOCS["a.txt"] + DOCS["b.txt"]).encode("utf-8"))  # the documents scored, no more
    assert two.nll == scoring.rolling_nlls(loaded, docs[:2]).sum()   # the same scorer on the same windows
    with pytest.raises(DataError, match="the token stream holds no document to score"):
        scoring.score_stream(loaded, np.array([0, 0]))


# Batched and padded against one sequence at a time, natively and under XLA_FLAGS=--xla_cpu_max_isa=AVX2: at
# most 4.8e-7 absolute, 9.7e-8 relative.
LOGPROB_RTOL, LOGPROB_ATOL = 1e-6, 1e-6


def greedy_extension(loaded, ids, n):
    """ids followed by n tokens each the model's argmax after all before it."""
    ids = list(ids)
    for _ in range(n):
        padded = np.zeros((1, SEQ_LEN), np.int32)
        padded[0, :len(ids)] = ids
        logits = forward_logits(loaded.model("xla"), loaded.params, padded, loaded.alphas())
        ids.append(int(np.argmax(logits[0, len(ids) - 1])))
    return ids


@pytest.mark.parametrize("n_long,n_short", [(24, 20), (24, 6)])
def test_token_logprobs_in_bucketed_batches_equal_one_sequence_at_a_time(loaded, monkeypatch, n_long, n_short):
    # n_long sequences of 18..33 tokens and n_short of 2..17 (the longest 17: 16 scored), shuffled. In batches
    # of 24, longest first: 24 rows padded to 32 positions, then the short ones to 16 positions in 24 rows
    # (20 rows: a power of two, 32, capped at the batch) or 16 rows (6 rows: at least 16).
    rng = np.random.default_rng(n_short)
    text = tok_lib.encode(loaded.tokenizer, DOCS["a.txt"] * 2)
    lengths = [18 + k % 16 for k in range(n_long)] + [2 + k % 16 for k in range(n_short - 1)] + [17]
    sequences = [text[(start := int(rng.integers(0, len(text) - n))):start + n] for n in lengths]
    sequences[0] = greedy_extension(loaded, sequences[0][:10], 20)  # greedy flags that must be true
    sequences = [sequences[i] for i in rng.permutation(len(sequences))]
    shapes, real = [], scoring._logprob_fn

    def recording(loaded_model, impl):
        fn = real(loaded_model, impl)
        return lambda params, alphas, tokens_BT, targets_BT: (shapes.append(tokens_BT.shape),
                                                              fn(params, alphas, tokens_BT, targets_BT))[1]

    monkeypatch.setattr(scoring, "_logprob_fn", recording)
    got = scoring.token_logprobs(loaded, sequences, batch_size=24)
    assert shapes == [(24, 32), (24 if n_short > 16 else 16, 16)]
    for seq, (logprob, greedy) in zip(sequences, got):
        want_logprob, want_greedy = logprobs_of(loaded, seq)
        np.testing.assert_allclose(logprob, want_logprob, rtol=LOGPROB_RTOL, atol=LOGPROB_ATOL)
        np.testing.assert_array_equal(greedy, want_greedy)
    assert sum(int(g.sum()) for _, g in got) >= 20
    for bad in ([5], text[:SEQ_LEN + 2]):
        with pytest.raises(ValueError, match=rf"a scored sequence has {len(bad)} tokens; it needs 2..{SEQ_LEN + 1}"):
            scoring.token_logprobs(loaded, [bad])



def test_scores_run_the_kernels_asked_for(loaded):
    tokens = np.zeros((1, 16), np.int32)
    programs = {impl: str(jax.make_jaxpr(scoring._logprob_fn(loaded, impl))(loaded.params, loaded.alphas(), tokens,
                                                                             tokens))
                for impl in ("xla", "pallas")}
    assert "pallas_call" in programs["pallas"] and "pallas_call" not in programs["xla"]


def test_rolling_windows_stream_in_chunks_and_an_empty_document_scores_nothing(loaded, monkeypatch):
    tok = loaded.tokenizer
    docs = [tok_lib.encode(tok, text) * 3 for text in DOCS.values()]   # 3 to 5 windows each at stride 16
    whole = scoring.rolling_nlls(loaded, docs, stride=16)
    sizes, real = [], scoring.token_logprobs
    monkeypatch.setattr(scoring, "WINDOWS_PER_CHUNK", 3)
    monkeypatch.setattr(scoring, "token_logprobs",
                        lambda m, seqs, **kw: (sizes.append(len(seqs)), real(m, seqs, **kw))[1])
    chunked = scoring.rolling_nlls(loaded, docs, stride=16)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6)  # the same windows in other batches: measured 0
    assert max(sizes) == 3 and sum(sizes) > 6
    assert scoring.rolling_logprobs(loaded, []).shape == (0,) and scoring.rolling_nll(loaded, []) == 0.0


def test_training_tasks_are_read_by_file_stem_and_two_of_one_name_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "words.jsonl").write_text('{"text": "a b"}\n')
    (tmp_path / "a" / "more.jsonl").write_text('{"text": "c d"}\n')
    with_tasks = lambda value: config_lib.override(Config(), [f"train.eval_tasks={value}"])
    a, b = tmp_path / "a", tmp_path / "b"
    read = tasks.read_training_tasks(with_tasks(f" {a / 'words.jsonl'} , {a / 'more.jsonl'},"))
    assert read == {"words": [tasks.LastWordExample("a", " b")], "more": [tasks.LastWordExample("c", " d")]}
    assert tasks.read_training_tasks(Config()) == {}
    with pytest.raises(ConfigError, match="train.eval_tasks: two files share a name"):
        tasks.read_training_tasks(with_tasks(f"{a / 'words.jsonl'},{b / 'words.jsonl'}"))



def test_cli_scores_the_data_asked_for_with_every_option(trained_run, loaded, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text * 8, encoding="utf-8")
    sets = ["data.source=files", f"data.path={folder}"]
    args = ["--workdir", str(trained_run()), *(a for s in sets for a in ("--set", s)), "--split", "train",
            "--stride", "8", "--max-documents", "1", "--batch-size", "5"]
    assert evaluate.main(args) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    want = scoring.score_stream(loaded, evaluate.data_tokens(loaded, sets, "train"), stride=8, max_documents=1)
    assert want.documents == 1 and want.tokens > 2 * SEQ_LEN   # several windows, each 8 new tokens
    assert line == f"train split of files {folder} (stride 8): {evaluate.format_perplexity(want)}"


def test_cli_refuses_bad_arguments_before_any_work(trained_run, tmp_path, capsys):
    run = str(trained_run())
    for args, code, message in [
        (["--set", "model.n_layer=2"], 2, "config error: --set 'model.n_layer=2': only data.* keys can be changed"),
        (["--stride", "33"], 2, "--stride 33 exceeds model.seq_len=32"),
        (["--batch-size", "0"], 2, "argument --batch-size: must be positive, got 0"),
        (["--task", str(tmp_path / "none.jsonl")], 1, f"error: {tmp_path / 'none.jsonl'}: cannot be read"),
    ]:
        try:
            assert evaluate.main(["--workdir", run, *args]) == code, args
        except SystemExit as e:  # argparse's own errors
            assert e.code == code, args
        assert message in capsys.readouterr().err, args
    # A bad task file is named before the model is looked for.
    assert evaluate.main(["--workdir", str(tmp_path / "nope"), "--task", str(tmp_path / "none.jsonl")]) == 1
    assert "none.jsonl: cannot be read" in capsys.readouterr().err


def test_cli_with_tasks_scores_them_in_batches_of_the_size_asked_and_no_perplexity(trained_run, monkeypatch,
                                                                                      capsys):
    sizes, real = [], evaluate.score_task
    monkeypatch.setattr(evaluate, "score_task", lambda m, ex, batch_size: (sizes.append(batch_size),
                                                                             real(m, ex, batch_size=batch_size))[1])
    task = str(REPO / "tasks" / "shakespeare_lambada.jsonl")
    assert evaluate.main(["--workdir", str(trained_run()), "--task", task, "--batch-size", "7"]) == 0
    out = capsys.readouterr().out
    assert sizes == [7] and f"{task} (last word, " in out and "split of" not in out


def test_the_data_scored_is_named_by_its_source():
    described = {source: evaluate.describe_data(DataConfig(source=source, path="corpus/x", tfds_name="lm1b"))
                 for source in ("embedded", "files", "tfds", "prepared")}
    assert described == {"embedded": "embedded tinyshakespeare", "files": "files corpus/x", "tfds": "tfds lm1b",
                         "prepared": "prepared dataset corpus/x"}
