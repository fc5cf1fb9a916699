"""lm-evaluation-harness model `andrea`: any lm-eval task on a run or export of this project.

    andrea-lm-eval --model andrea --model_args workdir=DIR[,step=N] \\
        --tasks andrea_shakespeare_mc,lambada_openai [--limit N] [other lm_eval options]

lm-eval 0.4.13 finds models only in its own registry (no entry points, no plugin hook), so the
`lm_eval` command cannot see a model defined outside lm_eval. Importing this module registers
`andrea`; `andrea-lm-eval` (installed with the package; also `python -m andrea_jax.serve.lm_eval_adapter`)
registers it and then runs lm_eval's own command line, unchanged. With no
--include_path it adds the project's tasks/lm_eval (andrea_shakespeare_mc, andrea_shakespeare_lambada).
From Python: `lm_eval.simple_evaluate(model=AndreaLM(workdir=...), tasks=[...])`, or
`model="andrea"` once this module is imported.

model_args: workdir=DIR or export=DIR, step=N (a workdir's checkpoint), batch_size=B, impl=xla|pallas|
triton, seed=S (sampling in generate_until). Scoring is andrea_jax.serve.evaluate's: `loglikelihood`
and `loglikelihood_rolling` (disjoint windows of model.seq_len, lm-eval's default) are the same
functions `andrea-evaluate` uses; `generate_until` samples with andrea_jax.serve.generate.
"""
from __future__ import annotations

if __name__ == "__main__":  # python -m andrea_jax.serve.lm_eval_adapter: jax starts as the console scripts start
    from andrea_jax import startup  # it (andrea_jax/commands.py), before the imports below import it
    startup.start_jax()

import pathlib
import sys

from andrea_jax.errors import MissingExtraError, is_missing
from andrea_jax.serve import load, scoring
from andrea_jax.data import tokenizer as tokenizer_lib

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    HAVE_LM_EVAL = True
except ImportError as err:
    if not is_missing(err, "lm_eval"):
        raise
    # Without the eval extra the module still imports, so that `andrea-lm-eval` can say in one line
    # what to install (main); AndreaLM then refuses to be built.
    HAVE_LM_EVAL = False
    LM, register_model = object, lambda name: (lambda cls: cls)

DEFAULT_MAX_GEN_TOKS = 256   # lm-eval's HF model's default
TASKS_DIR = pathlib.Path(__file__).resolve().parents[2] / "tasks" / "lm_eval"  # the repository's tasks/


def _batch_size(value, default: int) -> int:
    """lm-eval passes ints, or strings such as 'auto' (no auto-tuning here: the default)."""
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return default


def cut_at_stop(text: str, until) -> str:
    """`text` up to the first occurrence of any stop string."""
    for stop in until:
        if stop:
            text = text.split(stop, 1)[0]
    return text


@register_model("andrea")
class AndreaLM(LM):
    def __init__(self, workdir=None, export=None, step=None, batch_size=scoring.DEFAULT_BATCH,
                 impl=None, seed=0, max_batch_size=None, device=None, **unused):
        """Loads through andrea_jax.serve.load.load; `device` is ignored (JAX places the arrays)."""
        if not HAVE_LM_EVAL:
            raise MissingExtraError("AndreaLM", "eval")
        super().__init__()
        self.loaded = load.load(workdir=None if workdir is None else str(workdir),
                                     export=None if export is None else str(export),
                                     step=None if step is None else int(step))
        self.batch_size = _batch_size(batch_size, scoring.DEFAULT_BATCH)
        self.impl = impl
        self.seed = int(seed)

    @property
    def eot_token_id(self) -> int:
        return tokenizer_lib.eot_id(self.loaded.tokenizer)

    @property
    def max_length(self) -> int:
        return self.loaded.cfg.model.seq_len

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [tuple(req.args) for req in requests]
        results = scoring.loglikelihood(self.loaded, pairs, batch_size=self.batch_size, impl=self.impl)
        for pair, result in zip(pairs, results):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        documents = [tokenizer_lib.encode(self.loaded.tokenizer, text) for text in texts]
        nlls = scoring.rolling_nlls(self.loaded, documents, batch_size=self.batch_size, impl=self.impl)
        results = [-float(nll) for nll in nlls]
        for text, result in zip(texts, results):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), result)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with do_sample / temperature) continuations, cut at the first `until`
        string; requests with the same settings are generated together in batches."""
        from andrea_jax.serve import generate

        groups: dict = {}
        for index, req in enumerate(requests):
            context, gen_kwargs = req.args
            settings, until = self._settings(dict(gen_kwargs or {}))
            groups.setdefault(settings, []).append((index, context, until))
        outputs: list = [None] * len(requests)
        for settings, items in groups.items():
            for start in range(0, len(items), self.batch_size):
                batch = items[start:start + self.batch_size]
                prompts = [tokenizer_lib.encode(self.loaded.tokenizer, context) for _, context, _ in batch]
                new_ids = generate.generate(self.loaded, prompts, **dict(settings), seed=self.seed,
                                            stop_at_eot=True, impl=self.impl)
                for (index, context, until), ids in zip(batch, new_ids):
                    text = cut_at_stop(tokenizer_lib.decode(self.loaded.tokenizer, ids), until)
                    outputs[index] = text
                    self.cache_hook.add_partial("generate_until", (context, requests[index].args[1]), text)
        return outputs

    @staticmethod
    def _settings(gen_kwargs: dict):
        """(hashable keyword arguments of generate.generate, stop strings) from lm-eval gen_kwargs.

        Sampling is on with do_sample=True (temperature 1 unless given) or, when do_sample is
        absent, with a positive temperature; otherwise decoding is greedy (temperature 0)."""
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        temperature, do_sample = gen_kwargs.pop("temperature", None), gen_kwargs.pop("do_sample", None)
        if do_sample is None:
            do_sample = bool(temperature)
        temperature = (1.0 if temperature is None else float(temperature)) if do_sample else 0.0
        settings = (("max_new_tokens", int(gen_kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))),
                    ("temperature", temperature), ("top_k", int(gen_kwargs.pop("top_k", 0) or 0)),
                    ("top_p", float(gen_kwargs.pop("top_p", 1.0) or 1.0)))
        return settings, until


def main(argv=None) -> int | None:
    """lm_eval's command line with `andrea` registered (and the project's tasks, unless
    --include_path is given)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not HAVE_LM_EVAL:
        missing = MissingExtraError("andrea-lm-eval", "eval")
        if {"-h", "--help"} & set(argv):  # the help a user asks for first: what the command is, what it needs
            print(f"usage: andrea-lm-eval [lm_eval's arguments]\n\n{main.__doc__}\n\n{missing}")
            return 0
        print(f"error: {missing}", file=sys.stderr)
        return missing.exit_code
    from lm_eval.__main__ import cli_evaluate

    if "--include_path" not in argv and not any(a.startswith("--include_path=") for a in argv) \
            and TASKS_DIR.is_dir():
        argv += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
