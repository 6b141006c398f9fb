#!/usr/bin/env bash
# The GPU suite on a machine with CUDA, its own torch and no package registry: installs the project's other
# dependencies from wheels in .whl/ (built elsewhere for that machine's Python; torch is not among them),
# prints what it runs on, runs benchmarks/gpu_suite.sh with the given options, writing the suite's JSON into
# DIR, and leaves a tarball of its logs (runs/gpu_suite) there too.
#   bash benchmarks/gpu_offline.sh DIR [gpu_suite options]
# Exit status: the suite's (1 if anything failed), 2 if DIR is missing or the wheels do not install.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-}
if [ -z "$dir" ]; then echo "gpu_offline: give the folder for the results: bash benchmarks/gpu_offline.sh DIR" >&2; exit 2; fi
shift
mkdir -p "$dir" || exit 2
py=${PYTHON:-python3}
site=$(mktemp -d)
if ! ls .whl/*.whl >/dev/null 2>&1 || ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" .whl/*.whl; then
  echo "gpu_offline: no installable wheels in .whl/ (download them for this machine's Python first)" >&2
  exit 2
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHON="$py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$py" -c "import torch, torchrl, tensordict, lightning as L; print('torch', torch.__version__, 'torchrl', torchrl.__version__, 'tensordict', tensordict.__version__, 'lightning', L.__version__, 'cuda', torch.cuda.is_available())"
# The suite writes its JSON into DIR after every step, so a run stopped from outside leaves what it measured
# there; the logs follow when the suite ends or is stopped (SIGTERM, as a time limit's first signal).
trap 'tar czf "$dir/gpu_suite_logs.tgz" runs/gpu_suite 2>/dev/null' EXIT
trap 'exit 143' TERM
bash benchmarks/gpu_suite.sh --out-dir "$dir" "$@"
