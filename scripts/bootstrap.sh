#!/usr/bin/env bash
# Make this machine ready for sparkdp: Java 17+, the Fashion-MNIST files, the fortunes text corpus, a .venv with
# torch pinned to the CPU build, the package with its test and development extras, and the JVM class archive.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}   # pinned: an unpinned torch pulls a multi-GB CUDA build
DATA_DIR=/usr/share/datasets/fashion-mnist
FORTUNES_DIR=/usr/share/games/fortunes

is_root() { [ "$(id -u)" = 0 ]; }
apt_updated=0
apt_install() {
  if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

java_major() {
  local java=${JAVA_HOME:+$JAVA_HOME/bin/}java
  command -v "$java" >/dev/null 2>&1 || { echo 0; return; }
  "$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\(\.\([0-9]*\)\)\{0,1\}.*/\1 \3/p' | head -1 |
    awk '{ print ($1 == 1 ? $2 : $1) }'
}

if [ "$(java_major)" -lt 17 ] 2>/dev/null || [ -z "$(java_major)" ]; then
  if is_root && command -v apt-get >/dev/null; then
    echo "bootstrap: installing Java 17 (PySpark 4 needs Java >= 17)"
    apt_install openjdk-17-jre-headless
  else
    echo "bootstrap: PySpark 4 needs Java 17 or newer and none was found." >&2
    echo "  Install it (e.g. sudo apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME." >&2
    exit 1
  fi
fi

if [ ! -f "$DATA_DIR/train-images-idx3-ubyte.gz" ]; then
  if is_root && command -v apt-get >/dev/null; then
    echo "bootstrap: installing the Fashion-MNIST dataset (Debian package dataset-fashion-mnist)"
    apt_install dataset-fashion-mnist
  else
    echo "bootstrap: Fashion-MNIST is missing from $DATA_DIR." >&2
    echo "  Install it with: sudo apt-get install -y dataset-fashion-mnist" >&2
    echo "  (or point SPARKDP_FASHION_MNIST at a directory with the four IDX .gz files)" >&2
    exit 1
  fi
fi

# the text corpus of --dataset fortunes (language models); optional: its tests skip without it
if [ ! -f "$FORTUNES_DIR/cookie" ]; then
  if is_root && command -v apt-get >/dev/null; then
    echo "bootstrap: installing the fortunes text corpus (Debian package fortunes)"
    apt_install --no-install-recommends fortunes
  else
    echo "bootstrap: note: the fortunes corpus is missing from $FORTUNES_DIR (--dataset fortunes);" >&2
    echo "  install it with: sudo apt-get install -y fortunes" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "bootstrap: installing torch==$TORCH_VERSION (CPU build)"
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
fi
echo "bootstrap: installing sparkdp with its test and development extras (pytest, ruff, mypy)"
# torch pinned on this command line too: without it pip may resolve the extras to a newer (CUDA) torch
"$VENV/bin/python" -m pip install -q -e ".[dev]" "torch==$TORCH_VERSION"
# the JVM class archive every Spark session then starts from, about 3 s sooner (docs/benchmarks.md);
# once per Java and Spark installation, about a minute. Without it sessions start as they always did.
if ! "$VENV/bin/python" -c "import sys; from sparkdp.spark.jvm_archive import usable_archive; sys.exit(usable_archive() is None)"; then
  echo "bootstrap: writing the JVM class archive Spark sessions start from (sparkdp env --build-jvm-archive)"
  "$VENV/bin/sparkdp" env --build-jvm-archive >/dev/null ||
    echo "bootstrap: note: no JVM class archive was written; Spark sessions start without it, about 3 s slower" >&2
fi
