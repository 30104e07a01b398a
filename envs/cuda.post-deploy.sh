#!/usr/bin/env bash
# Runs inside the new conda environment, from the directory snakemake was started in (the repo).
set -euo pipefail
python -m pip install -e ".[cuda]"
