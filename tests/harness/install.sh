#!/usr/bin/env bash
# Installs the four real harnesses, pinned, into a cache dir (default ~/.cache/lego-proxy/harness,
# outside the checkout so that CI's fresh clones on the same machine reuse it).
# Idempotent: a stamp file records the pins; a second run with the same pins does nothing.
# CI and humans call it through `make harness-install`; the harness tests call it too when the
# cache is missing, so `pytest -m harness` works on a fresh checkout with registry access.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLAUDE_CODE_VERSION=2.1.197
OPENCODE_VERSION=1.18.33
CODEX_VERSION=0.171.0
OPENHANDS_VERSION=1.58.2
PY312_VERSION=${LEGO_HARNESS_PY312:-3.12.1}

cache=${LEGO_HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lego-proxy/harness}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
pins="claude-code=$CLAUDE_CODE_VERSION opencode=$OPENCODE_VERSION codex=$CODEX_VERSION openhands=$OPENHANDS_VERSION py=$PY312_VERSION"
if [ -f "$cache/stamp" ] && [ "$(cat "$cache/stamp")" = "$pins" ]; then
  exit 0
fi

# npm 11 skips postinstall scripts, but each CLI ships its platform binary as an optional
# dependency, so the plain install is enough to run them.
npm install --prefix "$cache/npm" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" \
  "opencode-ai@$OPENCODE_VERSION" \
  "@openai/codex@$CODEX_VERSION"

# openhands-sdk wheels need Python >= 3.12; pyenv's shim refuses an unselected version, so use
# the interpreter itself. Any other 3.12+ interpreter can be named with LEGO_HARNESS_PYTHON.
python312=${LEGO_HARNESS_PYTHON:-}
if [ -z "$python312" ]; then
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}/versions/$PY312_VERSION/bin/python3" python3.13 python3.12; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      python312=$candidate
      break
    fi
  done
fi
if [ -z "$python312" ]; then
  echo "install.sh: no Python >= 3.12 found (set LEGO_HARNESS_PYTHON)" >&2
  exit 1
fi
"$python312" -m venv --clear "$cache/py312"
# The system-wide pip constraints pin packages for Python 3.11; they do not apply here.
PIP_CONSTRAINT= "$cache/py312/bin/python" -m pip install -q \
  "openhands-sdk==$OPENHANDS_VERSION" "openhands-tools==$OPENHANDS_VERSION"

echo "$pins" > "$cache/stamp"
