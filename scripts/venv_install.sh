#!/usr/bin/env bash
# Install packages into the venv: with uv where it can, else with pip. uv unpacks in parallel and
# resolves the same versions; then what it installed is byte-compiled on every core
# (scripts/compile_new.py). `.[dev]`: 87 -> 33 s on 2 cores.
# uv reads no pip configuration, so pip's own settings (`pip config list`: indexes, find-links,
# constraints, the CA bundle) are handed to it; anything uv cannot do falls back to pip.
#   scripts/venv_install.sh .venv/bin -e '.[dev]'
set -euo pipefail
BIN=$1
shift

# pip's settings as uv flags, one per line (values with spaces are lists), from `pip config list`
uv_flags() {
  echo "$1" | while IFS='=' read -r key value; do
    value=${value#\'}
    value=${value%\'}
    case ${key##*.} in
      index-url) echo "--index-url=$value" ;;
      extra-index-url) for v in $value; do echo "--extra-index-url=$v"; done ;;
      find-links) for v in $value; do echo "--find-links=$v"; done ;;
      constraint) for v in $value; do echo "--constraint=$v"; done ;;
    esac
  done
}

pip_cert() {
  echo "$1" | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | tail -1
}

# the packages through uv, with pip's settings; fails where uv cannot be had or cannot install them
uv_install() {
  [ -x "$BIN/uv" ] || "$BIN/pip" install -q uv 2>/dev/null || return 1
  local config flags cert
  config=$("$BIN/pip" config list 2>/dev/null || true)
  mapfile -t flags < <(uv_flags "$config" | sort -u)
  cert=$(pip_cert "$config")
  if [ -n "$cert" ]; then export SSL_CERT_FILE=$cert; fi
  "$BIN/uv" pip install -q --python "$BIN/python" --index-strategy unsafe-best-match "${flags[@]}" "$@"
}

before=$(mktemp)
"$BIN/python" scripts/compile_new.py --list > "$before"
if ! uv_install "$@"; then
  echo "labkit: uv could not install $*; pip does" >&2
  "$BIN/pip" install -q "$@"
fi
"$BIN/python" scripts/compile_new.py "$before"  # what was installed, compiled on every core
rm -f "$before"
