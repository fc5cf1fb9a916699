"""Experiment K: Post-LN dose-response and the paper's best Post-LN schedule, on Experiment E's
recipe (Experiment A's) on the documentation corpus, 3 seeds, under the paper's Post-LN protocol
(scripts/sweeps/_questions.py; the released scripts' protocol: k_postln_dose_scripts.py):

    python -m andrea_jax.repro.sweep scripts/sweeps/k_postln_dose.py --jobs 2 --report

E's own arms (linear, linear_alpha) ran on the embedded corpus, which this recipe reads 1.3 times,
and under the released scripts' protocol; they are rerun here beside the new arms, on the new
corpus, so that the dose-response (updates x alpha^0, alpha^1, alpha^2) is one paired recipe.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import PAPER_PROTOCOL, POST_LN_COMMON, POST_LN_CONFIG

ARMS = {"none": ("prores.schedule=none",),
        "linear": ("prores.schedule=linear",),
        "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
        "linear_square": ("prores.schedule=linear_square",),
        "linear_square_alpha": ("prores.schedule=linear_square", "prores.scale_updates=alpha"),
        "linear_alpha_sq": ("prores.schedule=linear", "prores.scale_updates=alpha_sq"),
        "forward_false_alpha": ("prores.schedule=linear", "prores.forward=false", "prores.scale_updates=alpha"),
        # function-preserving: every block starts as the identity and only its updates ramp
        "function_preserving": ("prores.schedule=linear", "prores.forward=false", "prores.scale_updates=alpha",
                                "model.zero_init_out=true")}

SWEEP = Sweep(
    name="k_postln_dose",
    config=POST_LN_CONFIG,
    axes={},
    arms=ARMS,
    baseline="none",
    seeds=(0, 1, 2),
    common=(*POST_LN_COMMON, *PAPER_PROTOCOL),
)
