"""The launcher files in launch/ checked by each launcher's own parser, offline:

  skypilot.yaml   SkyPilot's Task.from_yaml (the parser `sky launch` runs first)
  dstack.yml      dstack's configuration models (parse_run_configuration, what `dstack apply` validates with)
  trainjob.yaml   the TrainJob CRD's published OpenAPI schema (launch/schemas/, from kubeflow/trainer), strict as
                  `kubectl apply --validate=strict`: an unknown field is an error, not silently dropped
  slurm.sbatch    SLURM's own sbatch, in tests/e2e/test_slurm.py (it needs slurmctld); here its #SBATCH lines

and each file's contract with the kit: at least two nodes, and the deploy as what runs.

    python tools/check_launch_files.py             # check the shipped files
    python tools/check_launch_files.py --self-test # each check must refuse a broken copy of its file

Needs `pip install skypilot dstack jsonschema pyyaml` (bash .ci/run installs them in a venv of their own: they are
heavy, and only this check uses them).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "launch"
SCHEMA = LAUNCH / "schemas" / "trainjob.trainer.kubeflow.org.v1alpha1.json"


class Refused(Exception):
    pass


def _runs_the_deploy(command: str, where: str) -> None:
    if "deploy_8gpu.sh" not in command and "trainers-entrypoint" not in command:
        raise Refused(f"{where}: the deploy (deploy_8gpu.sh or the image's entrypoint) is not what runs")


def check_skypilot(path: Path) -> str:
    import sky

    try:
        task = sky.Task.from_yaml(str(path))
    except Exception as err:  # (SkyPilot raises ValueError, jsonschema's errors and its own, all of them refusals)
        raise Refused(f"SkyPilot refuses it: {str(err).splitlines()[0]}") from None
    if task.num_nodes < 2:
        raise Refused(f"num_nodes is {task.num_nodes}: a multi-node file wants 2 or more")
    _runs_the_deploy(task.run or "", "its run")
    if "/workspace" not in (task.file_mounts or {}) and "/workspace" not in (task.storage_mounts or {}):
        raise Refused("no bucket is mounted at /workspace, where the nodes' shared run folder lives")
    return f"SkyPilot {sky.__version__} Task.from_yaml: {task.num_nodes} nodes, {task.resources}"


def check_dstack(path: Path) -> str:
    import yaml
    from dstack import version
    from dstack._internal.core.models.configurations import parse_run_configuration

    try:
        config = parse_run_configuration(yaml.safe_load(path.read_text()))
    except Exception as err:  # (pydantic's ValidationError and dstack's ConfigurationError)
        raise Refused(f"dstack refuses it: {' '.join(str(err).split())[:300]}") from None
    if config.type != "task" or config.nodes < 2:
        raise Refused(f"a {config.type} of {getattr(config, 'nodes', 1)} node(s): a multi-node task wants 2 or more")
    _runs_the_deploy(" ".join(config.commands), "its commands")
    return f"dstack {version.__version__} parse_run_configuration: task, {config.nodes} nodes"


def _strict(schema):
    """Unknown fields refused where the schema lists an object's fields (kubectl's strict field validation)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def check_trainjob(path: Path) -> str:
    import jsonschema
    import yaml

    published = json.loads(SCHEMA.read_text())
    manifest = yaml.safe_load(path.read_text())
    if (manifest.get("apiVersion"), manifest.get("kind")) != (published["apiVersion"], published["kind"]):
        raise Refused(f"{manifest.get('apiVersion')}/{manifest.get('kind')} is not {published['apiVersion']} "
                      f"{published['kind']}")
    schema = _strict(published["openAPIV3Schema"])
    # metadata is the API server's ObjectMeta, which the CRD leaves open: name is the one field this file sets
    schema["properties"]["metadata"] = {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}}
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(manifest), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path)
        raise Refused(f"the TrainJob schema refuses it at {where or '(top)'}: {errors[0].message[:200]}")
    trainer = manifest["spec"]["trainer"]
    if trainer.get("numNodes", 1) < 2:
        raise Refused(f"numNodes is {trainer.get('numNodes', 1)}: a multi-node file wants 2 or more")
    _runs_the_deploy(" ".join(trainer.get("command", [])), "its trainer.command")
    return f"TrainJob schema ({published['source'].split()[0]}), strict: {trainer['numNodes']} nodes"


def check_sbatch_lines(path: Path) -> str:
    text = path.read_text()
    options = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(\S*)", text, re.M))
    if options.get("ntasks-per-node") != "1":
        raise Refused("#SBATCH --ntasks-per-node must be 1: the deploy starts a worker per GPU itself")
    if not options.get("nodes", "1").isdigit() or int(options.get("nodes", "1")) < 2:
        raise Refused(f"#SBATCH --nodes={options.get('nodes')}: a multi-node file wants 2 or more")
    _runs_the_deploy(text[text.find("srun"):], "its srun line")
    return f"#SBATCH: {options['nodes']} nodes, one task per node (sbatch itself: tests/e2e/test_slurm.py)"


CHECKS: dict[str, Callable[[Path], str]] = {"skypilot.yaml": check_skypilot, "dstack.yml": check_dstack,
                                            "trainjob.yaml": check_trainjob, "slurm.sbatch": check_sbatch_lines}

# A broken copy of each file, the way a hand edit breaks one: each must be refused by its check.
BREAKS: list[tuple[str, str, str]] = [
    ("skypilot.yaml", "num_nodes: 2", "num_node: 2"),
    ("skypilot.yaml", "num_nodes: 2", "num_nodes: 1"),
    ("skypilot.yaml", "accelerators: H100:8", "accelerators: [H100:8, {bad: 1}]"),
    ("skypilot.yaml", "  /workspace:", "  /elsewhere:"),
    ("dstack.yml", "nodes: 2", "nodes: two"),
    ("dstack.yml", "nodes: 2", "nodess: 2"),
    ("dstack.yml", "  - bash deploy_8gpu.sh", "  - bash train.sh"),
    ("trainjob.yaml", "numNodes: 2", "numNode: 2"),
    ("trainjob.yaml", "numNodes: 2", "numNodes: \"2\""),
    ("trainjob.yaml", "mountPath: /workspace", "mountpath: /workspace"),
    ("trainjob.yaml", "name: trainers\n", "name: Trainers_Job\n"),
    ("slurm.sbatch", "--ntasks-per-node=1\n", "--ntasks-per-node=8\n"),
]


def check_all(folder: Path) -> list[str]:
    failures = []
    for name, check in CHECKS.items():
        try:
            print(f"ok   launch/{name}: {check(folder / name)}")
        except Refused as err:
            failures.append(f"launch/{name}: {err}")
            print(f"FAIL launch/{name}: {err}")
    return failures


def self_test() -> list[str]:
    missed = []
    for name, old, new in BREAKS:
        text = (LAUNCH / name).read_text()
        if old not in text:
            missed.append(f"{name}: the break's text {old!r} is not in the file")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            broken = Path(tmp) / name
            broken.write_text(text.replace(old, new, 1))
            try:
                CHECKS[name](broken)
                missed.append(f"{name}: {old!r} -> {new!r} was accepted")
                print(f"MISSED {name}: {old!r} -> {new!r}")
            except Refused as err:
                print(f"refused {name}: {old!r} -> {new!r}: {err}")
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="each check must refuse a broken copy of its file")
    args = parser.parse_args()
    failures = self_test() if args.self_test else check_all(LAUNCH)
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
