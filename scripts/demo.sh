#!/usr/bin/env bash
# Set up (idempotent) and run the offline demo. Extra arguments go to `diagsafe-local demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${DIAGSAFE_VENV:-.venv}/bin/diagsafe-local" demo "$@"
