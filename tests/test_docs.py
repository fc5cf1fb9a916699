"""Names in the docs and in the code's comments cannot drift from the code: every dotted
`andrea_jax.*` name (a module, or a module's attribute), every `python -m X` command, every
`andrea-*` console script and every repository path named in README.md, docs/**/*.md and the
project's .py and shell files resolves, and every relative Markdown link points at a file.

Modules are found with importlib.util.find_spec; an attribute imports its andrea_jax module and
getattr's it. Nothing outside the project is imported but what its modules import themselves.
"""
import functools
import importlib
import importlib.util
import pathlib
import re
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# `python -m` targets that are not the project's, each for a reason the docs give.
OTHER_MODULES = {
    "pytest": "the test command",
    "venv": "the install commands",
    "pip": "installing",
    "lm_eval": "lm-evaluation-harness's own command",
    "http.server": "serving a folder",
}
# `andrea-*` words that are not console scripts.
NOT_SCRIPTS = {
    "andrea-jax": "the distribution (pip install andrea-jax[...])",
    "andrea-jax-not-installed": "tests/test_prepare_dask.py's name for a missing package",
    "andrea-test": "tests/test_prepare_gcs.py's bucket",
    "andrea-tests": "tests/test_tracking.py's W&B project",
    "andrea-signals": "andrea_jax/signals.py's thread",
}
# Folders of the repository whose paths the docs name (`benchmarks/step.py`, `docs/RESULTS.md`).
PATH_ROOTS = ("andrea_jax", "kernels", "configs", "benchmarks", "scripts", "tests", "docs", "tasks")
# Components that stand for a name the reader chooses (`configs/NAME.py`, `andrea_jax.NAME`).
PLACEHOLDERS = {"NAME", "EXPERIMENT", "GROUP", "DIR", "OUT"}
# Kept as they were written: the superseded setup's reports (andrea_jax/repro/tables.py keeps them
# "unchanged"), whose commands and paths are those of the code that made them.
FROZEN = ("docs/prores_repro_superseded",)

NAME = re.compile(r"(?<![\w.])andrea_jax(?:\.[A-Za-z_]\w*)+")
PYTHON_M = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*\w)")
SCRIPT = re.compile(r"(?<![\w/.-])andrea-[a-z]+(?:-[a-z]+)*(?![\w/-])")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\.(?:py|md|sh|json|jsonl|txtpb|yaml|txt))(?![\w/])"
                  % "|".join(PATH_ROOTS))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def scanned_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", ROOT / "train.py", ROOT / ".ci" / "run", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("andrea_jax", "kernels", "configs", "benchmarks", "scripts", "tests"):
        files += sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.sh"))
    return [f for f in files if f.is_file() and not str(f.relative_to(ROOT)).startswith(FROZEN)]


@functools.cache
def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is missing or is not a package
        return False


@functools.cache
def name_problem(dotted: str) -> str | None:
    """None when `dotted` is a module or a module's attribute (chain), else what is wrong."""
    parts = dotted.split(".")
    if PLACEHOLDERS & set(parts):
        return None
    for i in range(len(parts), 0, -1):
        if module_exists(".".join(parts[:i])):
            break
    else:
        return "no such module"
    obj = importlib.import_module(".".join(parts[:i]))
    for j in range(i, len(parts)):
        if not hasattr(obj, parts[j]):
            return f"no module {'.'.join(parts[:i + 1])}, and {'.'.join(parts[:j])} has no attribute {parts[j]}"
        obj = getattr(obj, parts[j])
    return None


@functools.cache
def runnable_problem(module: str) -> str | None:
    """None when `module` runs under `python -m`: an andrea_jax module with a __main__ guard (or a
    package with a __main__), or one of OTHER_MODULES."""
    if PLACEHOLDERS & set(module.split(".")):
        return None
    if not module.startswith("andrea_jax"):
        return None if module in OTHER_MODULES else "not the project's and not in OTHER_MODULES"
    if not module_exists(module):
        return "no such module"
    spec = importlib.util.find_spec(module)
    if spec.submodule_search_locations is not None:
        return None if module_exists(module + ".__main__") else "a package without __main__"
    source = pathlib.Path(spec.origin).read_text()
    return None if re.search(r"if __name__ == [\"']__main__[\"']", source) else "no `if __name__ == \"__main__\"`"


@functools.cache
def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def script_problem(script: str) -> str | None:
    if script in NOT_SCRIPTS:
        return None
    return None if script in console_scripts() else "not in pyproject.toml's [project.scripts]"


def problems(text: str, where: pathlib.Path) -> list[str]:
    """What in `text` (the contents of `where`) names something that does not exist."""
    found = []

    def check(kind, regex, problem, group=0):
        for m in regex.finditer(text):
            if (why := problem(m.group(group))) is not None:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{where.relative_to(ROOT) if where.is_relative_to(ROOT) else where}:{line}: "
                             f"{kind} {m.group(group)}: {why}")

    check("name", NAME, name_problem)
    check("python -m", PYTHON_M, runnable_problem, group=1)
    check("console script", SCRIPT, script_problem)
    def path_problem(path):
        parts = pathlib.PurePath(path.rstrip(".")).parts
        if any(pathlib.PurePath(part).stem in PLACEHOLDERS for part in parts):
            return None
        return None if (ROOT / path.rstrip(".")).exists() else "no such file"
    check("path", PATH, path_problem, group=1)
    if where.suffix == ".md":
        def link_problem(target):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                return None
            return None if (where.parent / target.split("#")[0]).exists() else "no such file"
        check("link", LINK, link_problem, group=1)
    return found


def test_the_checker_reports_stale_names_and_passes_live_ones(tmp_path):
    # Built from pieces, so that this file's own text names nothing stale.
    pkg = "andrea" + "_jax"
    stale = [f"{pkg}.sharding", f"{pkg}.serve.lm_eval_adapter.NoSuchModel", f"{pkg}.lm_eval_adapter.AndreaLM",
             f"python -m {pkg}.serve", "python -m " + "no_such_tool",
             "andrea" + "-nosuch", "see [the page](NOSUCH.md)", "kernels/" + "nosuch.py"]
    live = [f"{pkg}.serve.lm_eval_adapter.AndreaLM", f"{pkg}.train.sharding.RULES", f"{pkg}.errors.AndreaError",
            f"python -m {pkg}.data.prepare", f"python -m {pkg}.aot", "python -m pytest", "andrea" + "-train",
            "andrea" + "-lm-eval", "[up](../README.md)", "`docs/" + "ARCHITECTURE.md`", "andrea" + "-jax[dask]",
            "`configs/" + "NAME.py`", f"python -m {pkg}.NAME"]
    doc = ROOT / "docs" / "FAKE.md"  # never written: links resolve against docs/
    for text in stale:
        assert len(problems(text, doc)) == 1, (text, problems(text, doc))
    assert [p.split(": ")[1] for p in problems(f"python -m {pkg}.trainer", doc)] == [
        f"name {pkg}.trainer", f"python -m {pkg}.trainer"]
    assert problems("\n".join(live), doc) == []
    assert problems(f"# {stale[0]}\n", ROOT / "train.py")[0].startswith(f"train.py:1: name {pkg}.sharding")


def test_every_console_script_resolves_and_the_readme_lists_it():
    readme = (ROOT / "README.md").read_text()
    for script, target in console_scripts().items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target
        assert f"`{script}`" in readme, f"{script} is not named in README.md"


@pytest.mark.parametrize("kind", ["docs", "code"])
def test_every_name_path_and_link_resolves(kind):
    files = [f for f in scanned_files() if (f.suffix == ".md") == (kind == "docs")]
    assert len(files) > (5 if kind == "docs" else 50)
    found = [p for f in files for p in problems(f.read_text(), f)]
    assert not found, "\n".join(found)
