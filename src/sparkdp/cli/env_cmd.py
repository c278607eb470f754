"""``sparkdp env``: what sparkdp will run with on this machine."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="show versions, Java, cores and dataset locations")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--build-jvm-archive",
        action="store_true",
        help="write the JVM class-data archive every later Spark session starts from (about 3 s sooner; "
        "about a minute once per Java and Spark installation)",
    )
    p.set_defaults(func=run)


def collect() -> dict:
    import pyspark
    import torch

    from ..data.datasets import FASHION_MNIST_DIR
    from ..data.text_datasets import FORTUNES_DIR
    from ..spark.environment import java_major_version
    from ..spark.jvm_archive import usable_archive

    return {
        "sparkdp": __import__("sparkdp").__version__,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "pyspark": pyspark.__version__,
        "java_major": java_major_version(),
        "cpu_count": os.cpu_count(),
        "fashion_mnist": str(FASHION_MNIST_DIR) if FASHION_MNIST_DIR.is_dir() else None,
        "fortunes": str(FORTUNES_DIR) if FORTUNES_DIR.is_dir() else None,
        "spark_submit_entry": str(Path(__file__).with_name("submit.py")),
        "jvm_class_archive": str(archive) if (archive := usable_archive()) else None,
    }


def run(args) -> int:
    if args.build_jvm_archive:
        from ..spark.jvm_archive_build import build

        print(f"built the JVM class archive {build()}", file=sys.stderr)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:16} {value}")
    return 0
