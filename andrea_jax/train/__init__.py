"""Training: the train state in its shardings, the jitted steps, the optimizer, the mesh and
its rules, checkpoints, preemption, diagnostics, and the loop with its hooks."""
