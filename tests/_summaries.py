"""A report's summary.json written by hand, for the tests of what reads one (compare, decide)."""
import json

COMMON = ("train.py --config depth:family=tiny,layers=24 --workdir /runs/{name}_s{seed} --set model.norm=pre "
          "--set optim.lr=3e-3")


def summary(path, experiment, arms: dict, seeds=(0, 1, 2)):
    """A report's summary.json: arms {name: (extra overrides, [final loss by seed])}."""
    runs = {}
    for name, (sets, losses) in arms.items():
        for seed, loss in zip(seeds, losses):
            command = (COMMON.format(name=name, seed=seed) + "".join(f" --set {s}" for s in sets)
                       + f" --set train.seed={seed}")
            runs[f"{name}_s{seed}"] = {"final_val_loss": loss, "best_val_loss": loss, "command": command}
    path.write_text(json.dumps({"experiments": {experiment: {"seeds": list(seeds), "arms": {a: {} for a in arms},
                                                            "runs": runs}}}))
    return path
