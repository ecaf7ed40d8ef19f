#!/usr/bin/env bash
# Install the `oracle` extra (llama-cpp-python). Building llama.cpp takes ~15 min on
# 2 cores, so the built wheel is cached per machine in ~/.cache/labkit/wheels and
# every later venv installs from it in seconds.
set -euo pipefail
PIP=${1:-.venv/bin/pip}
VERSION=0.3.36
CACHE=${LABKIT_WHEEL_CACHE:-$HOME/.cache/labkit/wheels}
mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "labkit: building llama-cpp-python $VERSION once for this machine (about 15 minutes on 2 cores)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    "$PIP" wheel -q --no-deps -w "$CACHE" "llama-cpp-python==$VERSION"
  wheel=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -1)
fi
"$PIP" install -q "$wheel" diskcache jinja2 typing-extensions
