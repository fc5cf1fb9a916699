"""Experiment I, stage 1's grid extended to lower learning rates, on the two seeds stage 2 chooses
on (0-1). On the documentation corpus, stage 1's seed 0 put `none`'s best LR at the lowest it tried
(5e-4) and left every ProRes arm on the unigram plateau at every LR it tried, so a best-against-best
comparison needs points below them:

    python -m andrea_jax.repro.sweep scripts/sweeps/i_postln_lr_low.py --jobs 2 --report
"""
import dataclasses

from i_postln_lr import SWEEP as STAGE1, lr_arms

LRS = {"none": ("2.5e-4",), "linear_alpha": ("2.5e-4", "5e-4"), "forward_false_alpha": ("5e-4", "1e-3")}

SWEEP = dataclasses.replace(
    STAGE1,
    name="i_postln_lr_low",
    arms=lr_arms(LRS),
    baseline="none_lr2.5e-4",
    seeds=(0, 1),
)
