#!/usr/bin/env bash
# Export the default pair to OpenVINO IR for `draftsman bench --peer openvino`.
#
#   scripts/export_openvino.sh [EXPORT_VENV]     (default: .venv-openvino-export)
#
# optimum-intel (the exporter) pins an older transformers than draftsman does, so it lives in
# a venv of its own; the benchmark itself needs only openvino-genai (the `openvino` extra).
# Idempotent: the venv is made once (stamp file), each model is exported once into
# $DRAFTSMAN_HOME/openvino/<name>-<format> (default home: ~/.cache/draftsman), through a
# dot-prefixed partial folder renamed when complete. Source: the models' local folders under
# $DRAFTSMAN_HOME/models (`draftsman models pull <name>`); nothing is fetched from the Hub.
#
# int4: 4-bit weights, group size 128, every layer that nncf quantizes to 4 bits (ratio 1.0;
# nncf keeps the embeddings and the output layer in int8), asymmetric (optimum's default).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv-openvino-export}"
PY="${PY:-python3}"
HOME_DIR="${DRAFTSMAN_HOME:-$HOME/.cache/draftsman}"
OUT_DIR="$HOME_DIR/openvino"
STAMP="$VENV/.installed"
# each model: <catalogue name> <weight format>
EXPORTS=(
  "qwen2.5-coder-1.5b-instruct int4"
  "qwen2.5-coder-0.5b-instruct int4"
  "qwen2.5-coder-1.5b-instruct int8"
  "qwen2.5-coder-0.5b-instruct int8"
)
# the exporter's pins: optimum-intel 2.2 wants transformers<5.6 (whose tokenizers is <=0.23.0);
# torch is draftsman's own CPU build (any other spec pulls CUDA packages)
TORCH="torch==2.13.0"
EXPORT_PKGS=(
  "transformers==5.5.4" "tokenizers==0.22.2" "huggingface-hub==1.21.0" "nncf==3.4.0"
  "openvino==2026.4.1" "openvino-tokenizers==2026.4.1.0" "requests>=2.33,<3" "setuptools"
)
# installed without their dependencies: optimum-intel lists torchvision, whose wheel would
# replace the CPU torch by a CUDA one; the LLM export never imports it
NO_DEPS_PKGS=("optimum==2.3.0" "optimum-intel==2.2.0")

if [[ ! -f "$STAMP" ]]; then
  echo "export_openvino: creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "$TORCH"
  constraint="$(mktemp)"
  trap 'rm -f "$constraint"' EXIT
  "$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
  "$VENV/bin/pip" install --quiet --constraint "$constraint" "${EXPORT_PKGS[@]}"
  "$VENV/bin/pip" install --quiet --no-deps "${NO_DEPS_PKGS[@]}"
  if "$VENV/bin/pip" list 2>/dev/null | grep -qi '^nvidia-'; then
    echo "export_openvino: CUDA packages slipped into $VENV; remove it and check pip" >&2
    exit 1
  fi
  touch "$STAMP"
else
  echo "export_openvino: $VENV is ready"
fi

mkdir -p "$OUT_DIR"
for entry in "${EXPORTS[@]}"; do
  read -r name fmt <<< "$entry"
  src="$HOME_DIR/models/$name"
  dest="$OUT_DIR/$name-$fmt"
  if [[ -f "$dest/openvino_model.xml" && -f "$dest/openvino_tokenizer.xml" ]]; then
    echo "export_openvino: $dest exists, kept"
    continue
  fi
  if [[ ! -f "$src/config.json" ]]; then
    echo "export_openvino: $src is missing; run: draftsman models pull $name" >&2
    exit 1
  fi
  args=(--weight-format "$fmt")
  [[ "$fmt" == int4 ]] && args+=(--group-size 128 --ratio 1.0)
  partial="$OUT_DIR/.$name-$fmt.partial"
  rm -rf "$partial"
  echo "export_openvino: exporting $name ($fmt) -> $dest"
  start=$SECONDS
  "$VENV/bin/optimum-cli" export openvino --model "$src" --task text-generation-with-past \
    "${args[@]}" "$partial"
  if [[ ! -f "$partial/openvino_tokenizer.xml" || ! -f "$partial/openvino_detokenizer.xml" ]]
  then
    echo "export_openvino: $partial has no OpenVINO tokenizer; is openvino-tokenizers there?" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv "$partial" "$dest"
  echo "export_openvino: $dest done in $((SECONDS - start)) s"
done
