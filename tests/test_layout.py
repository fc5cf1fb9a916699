"""The house rules of the layout, checked on the source so they cannot drift: no import
circle among the project's modules, packages that import one way (train and serve siblings that
import nothing of each other), no module but the config's schema over 400 lines, no function over
80 lines, no line over pyproject's ruff line-length, and nothing installed at the top level of
site-packages but the project's package."""
import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Folders whose modules are installed as andrea_jax.<folder> (pyproject.toml's package-dir).
SOURCES = {"andrea_jax": "andrea_jax", "kernels/src": "andrea_jax.kernels", "configs": "andrea_jax.configs"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def import_graph(mods) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its code (function bodies included):
    `from pkg import sub` depends on the submodule `sub`, not on all of `pkg`."""
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("andrea_jax"):
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                deps.update(subs if len(subs) == len(node.names) else [*subs, node.module])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("andrea_jax"))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def find_cycle(graph) -> list[str] | None:
    state, path = {}, []

    def visit(u):
        state[u] = "open"
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == "open":
                return path[path.index(v):] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        path.pop()
        state[u] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    graph = import_graph(modules())
    assert {"andrea_jax.config", "andrea_jax.model.transformer", "andrea_jax.kernels"} <= set(graph)
    assert "andrea_jax.model.layers" in graph["andrea_jax.model.transformer"]  # the graph sees imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_config_imports_nothing_of_the_project_but_its_error_text_parsing_and_shared_names():
    graph = import_graph(modules())
    assert graph["andrea_jax.config"] <= {"andrea_jax.errors", "andrea_jax.config_text", "andrea_jax.config_check",
                                          "andrea_jax.names"}
    assert graph["andrea_jax.config_check"] <= {"andrea_jax.errors", "andrea_jax.config_text"}
    assert graph["andrea_jax.config_text"] <= {"andrea_jax.errors", "andrea_jax.names"}
    assert graph["andrea_jax.names"] == set()


# The packages (and top-level modules) of andrea_jax, top to bottom. A module imports only from its
# own package or a lower rank, function bodies included: the packages of one rank are siblings that
# import nothing of each other (train and serve share what lies below them; the command line, cli,
# composes them). Only the base, the last rank of single modules that everything shares, imports
# within its rank (test_no_import_circle keeps it from going round). A name here that no longer
# exists is fine (moving a module is a one-word edit); a module whose name is not here fails the test.
RANKS = (
    {"commands"},
    {"cli", "aot", "repro"},
    {"serve", "train"},
    {"data", "model"},
    {"kernels"},
    {"checkpoint", "workdir", "config", "configs", "config_text", "config_check", "names", "mesh", "errors", "startup",
     "signals", "ramps", ""},
)


def package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def rank(module: str) -> int:
    top = package(module)
    ranks = [i for i, names in enumerate(RANKS) if top in names]
    assert ranks, f"{module}: its package {top!r} has no place in RANKS (tests/test_layout.py)"
    return ranks[0]


def allowed(module: str, dep: str) -> bool:
    """module may import dep: from its own package, a lower rank, or (in the base) its own rank."""
    return package(module) == package(dep) or rank(dep) > rank(module) or rank(dep) == rank(module) == len(RANKS) - 1


def forbidden_imports(graph) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if not allowed(m, d))


def test_packages_import_one_way(tmp_path):
    assert forbidden_imports(import_graph(modules())) == []
    # the check sees imports inside functions, up and between siblings both ways, and a package it does not know
    (tmp_path / "loop.py").write_text("def train():\n    from andrea_jax.serve import tasks\n")
    (tmp_path / "tasks.py").write_text("def hook():\n    from andrea_jax.train import loop\n")
    (tmp_path / "model.py").write_text("def init():\n    import andrea_jax.cli\n")
    (tmp_path / "cli.py").write_text("from andrea_jax.serve import tasks\nfrom andrea_jax.train import loop\n")
    graph = import_graph({"andrea_jax.train.loop": tmp_path / "loop.py",
                          "andrea_jax.serve.tasks": tmp_path / "tasks.py",
                          "andrea_jax.model.transformer": tmp_path / "model.py",
                          "andrea_jax.cli": tmp_path / "cli.py"})
    assert forbidden_imports(graph) == ["andrea_jax.model.transformer -> andrea_jax.cli",
                                        "andrea_jax.serve.tasks -> andrea_jax.train.loop",
                                        "andrea_jax.train.loop -> andrea_jax.serve.tasks"]
    try:
        rank("andrea_jax.NAME.module")  # a package that is not ranked
    except AssertionError:
        pass
    else:
        raise AssertionError("a package missing from RANKS passed")


def test_train_and_serve_are_siblings_that_import_nothing_of_each_other():
    graph = import_graph(modules())
    assert rank("andrea_jax.serve.load") == rank("andrea_jax.train.loop")
    crossing = [f"{m} -> {d}" for m, deps in graph.items() for d in deps
                if {package(m), package(d)} == {"serve", "train"}]
    assert crossing == [], crossing
    # the command line composes them: it imports both (inside its functions)
    assert {"andrea_jax.serve.tasks", "andrea_jax.train.hooks"} <= graph["andrea_jax.cli"]


def test_no_line_of_the_code_is_longer_than_the_ruff_line_length():
    """The package and train.py, and the tests, scripts and benchmarks too, their shell scripts
    included: they are read as often as the package."""
    limit = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    others = sorted(path for folder in ("tests", "scripts", "benchmarks") for pattern in ("*.py", "*.sh")
                    for path in (ROOT / folder).rglob(pattern))
    paths = [*modules().values(), ROOT / "train.py", *others]
    long_lines = [f"{path.relative_to(ROOT)}:{i}" for path in paths
                  for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > limit]
    assert limit == 120 and len(modules()) > 60 and len(others) > 100 and long_lines == [], long_lines


# The config's schema grows a field at a time and holds nothing else (what reads a config is in
# andrea_jax.configs and andrea_jax.config_text, what checks one across sections in
# andrea_jax.config_check): the one module without the 400-line cap.
SCHEMA = "andrea_jax.config"


def test_no_module_but_the_schema_over_400_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for name, path in modules().items():
        text = path.read_text()
        if name != SCHEMA and len(text.splitlines()) > 400:
            long_modules.append(f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long_modules and not long_functions, long_modules + long_functions


def test_only_the_project_package_is_installed_at_the_top_level():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "andrea_jax" or p.startswith("andrea_jax.") for p in setup["packages"]), setup["packages"]
    assert setup["package-dir"] == {"andrea_jax.kernels": "kernels/src", "andrea_jax.configs": "configs"}
    # every package folder is listed, so nothing is left out of the install either
    listed = set(setup["packages"])
    assert {n for n, p in modules().items() if p.name == "__init__.py"} <= listed
