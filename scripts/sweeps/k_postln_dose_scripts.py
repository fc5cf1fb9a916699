"""Experiment K under the released scripts' protocol (2% LR warmup, LR 2e-3, T L = 12x the
warmup; scripts/sweeps/_questions.py), the same arms and seeds as k_postln_dose.py:

    python -m andrea_jax.repro.sweep scripts/sweeps/k_postln_dose_scripts.py --jobs 2 --report
"""
import dataclasses

from _questions import POST_LN_COMMON, SCRIPTS_PROTOCOL
from k_postln_dose import SWEEP as PAPER

SWEEP = dataclasses.replace(PAPER, name="k_postln_dose_scripts", common=(*POST_LN_COMMON, *SCRIPTS_PROTOCOL))
