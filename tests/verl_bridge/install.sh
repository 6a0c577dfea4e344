#!/usr/bin/env bash
# Builds the environment tests/verl_bridge run verl in (default ~/.cache/lego-proxy/verl-venv,
# outside the checkout so that CI's fresh clones on the same machine reuse it), and prints
# its interpreter on stdout.
#
# verl 0.9.1 pins transformers<5.11 and tensordict<=0.10; lego-proxy runs a newer
# transformers, so verl never goes into the project's own environment. This venv sees that
# environment's packages (--system-site-packages: torch, transformers, numpy, lego-proxy's
# dependencies), gets verl with --no-deps, and only what verl's agent loop imports on top;
# a constraints file pins every package it shares with the base environment to the version
# installed there, so pip fails rather than replace one.
# Idempotent: a stamp file records the pins; a second run with the same pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PY:-python3}
VERL_VERSION=0.9.1
# What `import verl.experimental.agent_loop` needs beyond the base environment, found by
# importing it: verl.protocol (ray, tensordict), the agent loop (hydra, omegaconf, PIL,
# datasets via verl.utils.dataset, cachetools via the rollout router), verl.utils (codetiming,
# pylatexenc, torchdata).
EXTRAS="ray==2.60.0 hydra-core==1.3.8 omegaconf==2.3.1 tensordict==0.10.0 codetiming==1.4.0
pylatexenc==2.11 torchdata==0.11.0 pillow==13.0.0 datasets==5.2.0 cachetools==8.0.2"
SHARED="torch transformers tokenizers numpy safetensors pydantic fastapi httpx huggingface-hub"

venv=${LEGO_VERL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lego-proxy/verl-venv}
base=$("$PY" -c 'import sys; print(sys.prefix)')
pins="verl=$VERL_VERSION $(echo $EXTRAS) base=$base"
if [ -f "$venv/stamp" ] && [ "$(cat "$venv/stamp")" = "$pins" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi

rm -rf "$venv"
"$PY" -m venv --system-site-packages "$venv"
"$PY" - "$SHARED" > "$venv/constraints.txt" <<'PYTHON'
import sys
from importlib import metadata

for name in sys.argv[1].split():
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
PYTHON
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$venv/constraints.txt")
"${pip[@]}" --no-deps "verl==$VERL_VERSION" >&2
# shellcheck disable=SC2086  # one word per requirement
"${pip[@]}" $EXTRAS >&2
"$venv/bin/python" -c 'import verl.experimental.agent_loop.agent_loop' >&2
echo "$pins" > "$venv/stamp"
echo "$venv/bin/python"
