"""Experiment K's one ProRes arm that kept up with the baseline under the paper's Post-LN protocol,
function-preserving ProRes (zero-init out projections, forward alpha at 1, updates x alpha), against
`none` at 5 seeds: K's recipe and protocol unchanged (k_postln_dose.py), its 3 seeds rerun beside 2
new ones so that every pair comes from one machine:

    python -m andrea_jax.repro.sweep scripts/sweeps/k_function_preserving.py --jobs 2 --report

10 runs, measured 4.0-4.7 min each two at a time on 2 cores: 21 min of wall time
(docs/k/function_preserving/).
"""
import dataclasses

from k_postln_dose import ARMS, SWEEP as K

SWEEP = dataclasses.replace(K, name="k_function_preserving", seeds=(0, 1, 2, 3, 4),
                            arms={arm: ARMS[arm] for arm in ("none", "function_preserving")})
