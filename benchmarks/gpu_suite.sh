#!/usr/bin/env bash
# The GPU suite: pytest -m gpu, then each optimization's bench for DQN, SAC and TD-MPC2, into one JSON
# (benchmarks/results/gpu_suite_<device>.json) with the device's name. Exits 1 if anything failed.
# Without CUDA it runs its CPU-sized parts. Options: --out PATH, --cpu, --skip-tests, --timeout S, --budget S,
# --algos A,B, --variants V,W, --override KEY=VALUE, --profile (py-spy over the TD-MPC2 benches).
# See benchmarks/gpu_suite.py for what each step measures; benchmarks/gpu_offline.sh runs it where only
# wheels can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" benchmarks/gpu_suite.py "$@"
