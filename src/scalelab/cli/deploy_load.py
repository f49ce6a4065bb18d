"""`scalelab deploy load-job`: Kubernetes manifests for a Dask cluster of load generators."""

from __future__ import annotations

from pathlib import Path

import click

from scalelab.cli._output import emit, json_option
from scalelab.lab.load.k8s import LoadJobSpec, write


@click.command("load-job")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder for scheduler.yaml and workers.yaml.")
@click.option("--name", default="scalelab-load", show_default=True)
@click.option("--image", default="scalelab:latest", show_default=True,
              help="An image with scalelab installed.")
@click.option("--workers", default=2, show_default=True, type=int,
              help="Generator pods (one generator each).")
@click.option("--cpu", default="1", show_default=True, help="CPU per worker pod.")
@click.option("--memory", default="1Gi", show_default=True, help="Memory per worker pod.")
@json_option
def load_job_cmd(out: Path, name: str, image: str, workers: int, cpu: str, memory: str,
                 as_json: bool) -> None:
    """A Dask scheduler (Deployment + Service) and WORKERS generator pods; then run `scalelab
    load URL --cluster tcp://NAME-scheduler:8786` from a pod in the same cluster.

    Example: scalelab deploy load-job --out k8s-load --workers 4
    """
    spec = LoadJobSpec(name=name, image=image, workers=workers, cpu=cpu, memory=memory)
    paths = write(spec, out)
    emit({"files": [str(p) for p in paths], "cluster": spec.scheduler}, as_json,
         lambda c: c.print(f"wrote {', '.join(str(p) for p in paths)}; then run scalelab "
                           f"load URL --cluster {spec.scheduler} from a pod in the cluster"))
