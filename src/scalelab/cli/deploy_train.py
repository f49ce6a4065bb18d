"""`scalelab deploy train-job`: Kubernetes manifests for a multi-node transformer run."""

from __future__ import annotations

from pathlib import Path

import click

from scalelab.cli._output import emit, json_option
from scalelab.system.train.parallel.k8s import TrainJobSpec, write


@click.command("train-job", context_settings={"ignore_unknown_options": True})
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder for service.yaml, job.yaml and pytorchjob.yaml.")
@click.option("--name", default="scalelab-train", show_default=True)
@click.option("--image", default="scalelab:latest", show_default=True)
@click.option("--nodes", default=2, show_default=True, type=int, help="Pods (machines).")
@click.option("--nproc", default=1, show_default=True, type=int, help="Processes per pod.")
@click.option("--claim", default="scalelab-train", show_default=True,
              help="ReadWriteMany PersistentVolumeClaim for the run directory and checkpoints.")
@click.option("--max-restarts", default=3, show_default=True, type=int)
@json_option
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def train_job_cmd(out: Path, name: str, image: str, nodes: int, nproc: int, claim: str,
                  max_restarts: int, as_json: bool, train_args: tuple[str, ...]) -> None:
    """Indexed Job + headless Service (and a PyTorchJob) running `scalelab train --model
    transformer` on NODES pods; options after `--` go to `scalelab train`.

    Example: scalelab deploy train-job --out k8s --nodes 2 -- --strategy fsdp --steps 1000
    """
    spec = TrainJobSpec(name=name, image=image, nodes=nodes, nproc_per_node=nproc, claim=claim,
                        max_restarts=max_restarts, args=list(train_args))
    paths = write(spec, out)
    emit({"files": [str(p) for p in paths], "command": spec.command(
        f"{name}-0.{name}:29400")}, as_json,
        lambda c: c.print(f"wrote {', '.join(str(p) for p in paths)}"))
