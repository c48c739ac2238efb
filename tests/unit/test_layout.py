"""The layout every trainer follows: a folder per trainer with pure model files, shared packages beside
them, and no import cycle between folders."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT
from trainers.registry import TRAINERS

PACKAGE = ROOT / "trainers"
TRAINER_FILES = ("config.py", "model.py", "train.py", "export.py", "cli.py", "deploy.sh")
MODEL_MAY_IMPORT = {"torch", "__future__", "math", "dataclasses", "typing"}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_trainer_has_its_folder_with_the_usual_files(trainer):
    folder = PACKAGE / trainer
    missing = [f for f in TRAINER_FILES if not (folder / f).is_file()]
    assert not missing, f"trainers/{trainer} lacks {missing}"


@pytest.mark.parametrize("model", sorted(PACKAGE.glob("*/model.py")), ids=lambda p: p.parent.name)
def test_model_files_import_only_torch(model):
    bad = {m for m in imports_of(model) if m.split(".")[0] not in MODEL_MAY_IMPORT}
    assert not bad, f"{model.relative_to(ROOT)} imports {sorted(bad)}"


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "trainers" or len(parts) < 2:
        return None
    return parts[1] if (PACKAGE / parts[1]).is_dir() else "(top)"


def test_no_import_cycle_between_folders():
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        src = rel.parts[0] if len(rel.parts) > 1 else "(top)"
        for module in imports_of(path):
            dst = folder_of(module)
            if dst and dst != src and dst != "(top)":
                edges.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str, seen=None) -> bool:
        seen = seen or set()
        for nxt in edges.get(a, ()):
            if nxt == b or (nxt not in seen and reaches(nxt, b, seen | {nxt})):
                return True
        return False

    cycles = sorted((a, b) for a in edges for b in edges[a] if reaches(b, a))
    assert not cycles, f"folders import each other: {cycles} (edges: {edges})"


def test_the_shared_runtime_knows_no_trainer():
    for path in (PACKAGE / "runtime").rglob("*.py"):
        trainer_imports = {m for m in imports_of(path) if folder_of(m) in TRAINERS}
        assert not trainer_imports, f"{path.name} imports {trainer_imports}"


def test_the_old_flat_modules_are_gone():
    for old in ("jobs", "models", "data", "coloring.py", "evaluation.py", "export.py", "onnx_color.py",
                "nccl_check.py", "runfiles.py", "preflight.py", "package.py"):
        assert not (PACKAGE / old).exists(), old


def test_ruff_finds_no_unused_or_undefined_names_and_imports_are_sorted():
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is in the test extra: pip install -e '.[test]'")
    proc = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Module -> the trainers modules it imports, at any depth (an import inside a function is an
    edge too: hiding an import there does not break a circle, it postpones it). `from a import b`
    is an edge to `a.b` when that is a module, else to `a`."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: set() for m in modules}
    for m, path in modules.items():
        package = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    graph[m].add(full if full in modules else base)
        graph[m] = {d for d in graph[m] if d in modules and d != m}
    return graph


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    """Circles made evaluation, export and sizing import the training script; the model is built in
    each trainer's build.py and train.py imports evaluation, never the reverse."""
    cycles = cycles_of(module_graph())
    assert not cycles, f"import circles: {cycles}"


def test_the_cycle_check_sees_an_import_hidden_in_a_function():
    graph = module_graph()
    graph["trainers.gnn.build"] = graph["trainers.gnn.build"] | {"trainers.gnn.train"}  # train imports build
    assert any({"trainers.gnn.build", "trainers.gnn.train"} <= set(c) for c in cycles_of(graph))


@pytest.mark.parametrize("trainer", TRAINERS)
def test_evaluation_and_export_never_import_training(trainer):
    for name in ("evaluate.py", "export.py", "build.py", "size.py"):
        path = PACKAGE / trainer / name
        if path.is_file():
            assert f"trainers.{trainer}.train" not in imports_of(path), f"trainers/{trainer}/{name} imports train"


def calls_named(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in names) or
        (isinstance(n.func, ast.Attribute) and n.func.attr in names))]


def test_ddp_is_built_in_one_place():
    """Every DDP the trainers use comes from runtime.dist.wrap_ddp (bucket views, no buffer re-sync,
    a static graph only where no step accumulates under no_sync)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "runtime" / "dist.py":
            continue
        tree = ast.parse(path.read_text())
        aliases = {"DistributedDataParallel"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                                                  for a in n.names if a.name == "DistributedDataParallel" and a.asname}
        offenders += [f"{path.relative_to(ROOT)}:{c.lineno}" for c in calls_named(tree, aliases)]
    assert not offenders, f"DDP built by hand: {offenders}"


def run_names(tree: ast.AST) -> set[str]:
    """Names bound to a Run: `with Run(...) as run`, `run = Run(...)`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) and \
                isinstance(node.context_expr, ast.Call) and getattr(node.context_expr.func, "id", None) == "Run":
            names.add(node.optional_vars.id)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", None) == "Run":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assignments_into_run(source: str) -> list[int]:
    tree = ast.parse(source)
    names = run_names(tree)
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        lines += [node.lineno for t in targets if isinstance(t, (ast.Attribute, ast.Subscript)) and root_name(t) in names]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args and \
                root_name(node.args[0]) in names:
            lines.append(node.lineno)
    return lines


def test_no_trainer_writes_into_the_run_or_its_parts():
    """A loop asks the run (request_stop, quiet_progress), it does not rewire it."""
    offenders = []
    for trainer in TRAINERS:
        for path in (PACKAGE / trainer).rglob("*.py"):
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in assignments_into_run(path.read_text())]
    assert not offenders, offenders


def test_the_run_check_sees_writes_into_the_run():
    source = ("with Run(cfg) as run:\n    run.bar = None\n    run.stopper.signal_name = 'x'\n"
              "    run.clock.phases['a'] += 1\n    setattr(run, 'step', 3)\n    other.bar = 1\n")
    assert assignments_into_run(source) == [2, 3, 4, 5]


def config_reads_by_name(source: str) -> list[int]:
    """`getattr(cfg, "field", default)`, `getattr(cfg, "field")`, `hasattr(cfg, ...)` on anything named
    like a config (cfg, self.cfg, config). Reading every field of a dataclass in a loop is fine."""
    lines = []
    for call in calls_named(ast.parse(source), {"getattr", "hasattr"}):
        target = call.args[0] if call.args else None
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        by_name = len(call.args) > 1 and isinstance(call.args[1], ast.Constant)
        if ("cfg" in name or "config" in name) and (call.func.id == "hasattr" or len(call.args) == 3 or by_name):
            lines.append(call.lineno)
    return lines


def test_the_runtime_reads_no_config_field_by_name_with_a_default():
    """Every option the runtime reads is declared on RunOptions, so a reader can see what it needs."""
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in (PACKAGE / "runtime").rglob("*.py")
                 for n in config_reads_by_name(p.read_text())]
    assert not offenders, offenders
    assert config_reads_by_name("getattr(self.cfg, 'min_delta', 0.0)\nhasattr(cfg, 'x')\ngetattr(cfg, f.name)\n"
                                "getattr(config, 'seed')\n") == [1, 2, 4]


@pytest.mark.parametrize("path,most", [("runtime/run.py", 249), ("lstm/train.py", 249)] +
                         [(f"runtime/{p.name}", 400) for p in sorted((PACKAGE / "runtime").glob("*.py"))])
def test_files_stay_small_enough_to_read(path, most):
    lines = len((PACKAGE / path).read_text().splitlines())
    assert lines <= most, f"trainers/{path} has {lines} lines (at most {most})"


def cuda_uses(source: str) -> list[int]:
    """Lines that reach torch.cuda (or torch.backends.cuda): `torch.cuda.x`, an alias of torch,
    `import torch.cuda`, `from torch import cuda`, `from torch.cuda import x`."""
    tree = ast.parse(source)
    torch_names = {"torch"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                               for a in n.names if a.name == "torch" and a.asname}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "cuda" and root_name(node.value) in torch_names and \
                not (isinstance(node.value, ast.Attribute) and node.value.attr == "version"):  # (a build's version string)
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name.startswith("torch.cuda") for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("torch.cuda") or (node.module in ("torch", "torch.backends") and
                                                         any(a.name == "cuda" for a in node.names))):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_cuda_is_reached_through_one_seam():
    """Every CUDA-only call has its CPU answer in runtime/device.py, so a missing guard fails a CPU
    test here instead of crashing on the pod."""
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py") if p != PACKAGE / "runtime" / "device.py"
                 for n in cuda_uses(p.read_text())]
    assert not offenders, offenders
    assert cuda_uses("import torch as t\nt.cuda.synchronize()\nfrom torch import cuda\nimport torch.cuda\n"
                     "x = torch.backends.cuda.matmul\ny.cuda()\nv = torch.version.cuda\n") == [2, 3, 4, 5]


def loops_after_resume(path: Path) -> list[tuple[int, bool]]:
    """Each `while` loop in a function that calls `.resume()` (a training loop): its line, and whether its
    condition reads a Start's `ended` (a run resumed at its early stop trains no further: Run.resume)."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "resume"]
        if calls:
            found += [(w.lineno, any(isinstance(n, ast.Attribute) and n.attr == "ended" for n in ast.walk(w.test)))
                      for w in ast.walk(fn) if isinstance(w, ast.While)]
    return found


@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_training_loop_stops_where_a_resumed_run_had_stopped_early(trainer):
    if trainer == "lstm":  # its one loop is the cohort's (a symbol alone is a cohort of one): a member resumed where
        # it had stopped early is finished before the loop, which trains only those not done
        source = (PACKAGE / "lstm" / "cohort.py").read_text()
        assert "m.step, m.ended = start.step, start.ended" in source and "m.step >= m.total_steps or m.ended" in source
        return
    loops = loops_after_resume(PACKAGE / trainer / "train.py")
    assert loops and all(reads for _line, reads in loops), f"trainers/{trainer}/train.py loops {loops}"


def test_the_loop_check_sees_a_loop_that_ignores_ended(tmp_path):
    bad = tmp_path / "train.py"
    bad.write_text("def train(run):\n    start = run.resume()\n    while step < total:\n        step += 1\n")
    assert loops_after_resume(bad) == [(3, False)]


def wind_down_writes(source: str) -> list[int]:
    """Lines that set a field of an LSTM worker's WindDown (`x.wind_down.f = ...`, `+=`, or through a name bound to
    `x.wind_down`): the wind-down is told events and decides (issue 61); only trainers/lstm/wind_down.py sets them."""
    tree = ast.parse(source)
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
               and n.value.attr == "wind_down" for t in n.targets if isinstance(t, ast.Name)}

    def is_wind_down(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "wind_down") or \
            (isinstance(node, ast.Name) and (node.id == "wind_down" or node.id in aliases))
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and is_wind_down(t.value):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_only_the_wind_down_sets_its_fields():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py") if p != PACKAGE / "lstm" / "wind_down.py"
                 for n in wind_down_writes(p.read_text())]
    assert not offenders, offenders
    assert wind_down_writes("worker.wind_down.to_export = 0\nw = self.wind_down\nw.training += 1\n"
                            "self.wind_down.training, x = 1, 2\nworker.wind_down.ended(1.0)\ny = w.finishing\n") == [1, 3, 4]
