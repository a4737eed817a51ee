#!/usr/bin/env bash
# Build llama.cpp -- the copy vendored in llama-cpp-python's pinned sdist -- with native CPU
# flags into $VENV/llama.cpp, keeping the build tree there so later targets reuse it.
#   scripts/build_llama_cpp.sh .venv                            shared libraries (make setup)
#   scripts/build_llama_cpp.sh .venv llama-speculative-simple   llama.cpp's own speculative
#                                                               example (the benchmark peer)
#   scripts/build_llama_cpp.sh .venv llama-lookup               its lookup (prompt n-gram)
#                                                               example, the other peer
# A stamp per target makes a repeated call a no-op.
set -euo pipefail

VENV=${1:-.venv}
shift || true
TARGETS=("${@:-llama}")
VERSION=0.3.36
# the stamps' name: a change of how it is built (flags, mends) builds it again
BUILD_ID="$VERSION-amx-mends-2-${DRAFTSMAN_LLAMA_AMX:-1}"
PREFIX="$VENV/llama.cpp"
SRC="$PREFIX/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$PREFIX/build"

todo=()
for t in "${TARGETS[@]}"; do
  [[ -f "$PREFIX/.built-$t-$BUILD_ID" ]] || todo+=("$t")
done
[[ ${#todo[@]} -eq 0 ]] && exit 0

if [[ ! -d "$SRC" ]]; then
  mkdir -p "$PREFIX/src"
  "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" \
    -d "$PREFIX/src"
  tar xzf "$PREFIX/src/llama_cpp_python-$VERSION.tar.gz" -C "$PREFIX/src"
fi
# On AMX CPUs a native build compiles ggml's AMX matmul. As vendored it crashes on the first
# multi-row matmul when GCC drops the stores of its tile configuration
# (ggml-org/llama.cpp#20824), and on the first after our own AMX kernels ran in its threads;
# scripts/patch_llama_cpp.py mends both, and so mended it is llama.cpp at its best there:
# prompts of 8+ rows 1.2-1.75x faster than the AVX-512 repacked kernels, one-token decoding
# within a few percent (bench-results/llama-cpp-amx-kernels). DRAFTSMAN_LLAMA_AMX=0 compiles
# the AMX kernels out instead (GCC lets an explicit -mno-<isa> win over -march=native),
# keeping AVX-512, VNNI and the repacked weights.
ISA_FLAGS=""
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null && [[ "${DRAFTSMAN_LLAMA_AMX:-1}" == 0 ]]; then
  ISA_FLAGS="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16"
fi
"$VENV/bin/python" "$(dirname "$0")/patch_llama_cpp.py" "$SRC"
# configured on every build, so that flags changed since the last one take effect
GENERATOR=()
if [[ ! -f "$BUILD/CMakeCache.txt" ]] && command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
cmake -S "$SRC" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$ISA_FLAGS" -DCMAKE_CXX_FLAGS="$ISA_FLAGS" \
  -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON >/dev/null
#   scripts/build_llama_cpp.sh .venv llama-server   its HTTP server (the load benchmark's peer)
if [[ " ${todo[*]} " == *" llama-server "* ]]; then
  # the server is one of llama.cpp's tools, off in the library build: turn them on here only
  cmake -S "$SRC" -B "$BUILD" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_OPENSSL=OFF >/dev/null
fi
echo "building llama.cpp $VERSION (${todo[*]}) with native CPU flags; once, several minutes..."
cmake --build "$BUILD" --parallel "$(nproc)" --target "${todo[@]}"

mkdir -p "$PREFIX/lib" "$PREFIX/bin"
# what the backend and every results row report about this build (llama_cpp.build_info)
AMX_KERNELS=false
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null && [[ -z "$ISA_FLAGS" ]]; then AMX_KERNELS=true; fi
cat > "$PREFIX/build-info.json" <<JSON
{"version": "$VERSION", "native": true, "extra_flags": "$ISA_FLAGS", "amx_kernels": $AMX_KERNELS,
 "amx_tile_config_mended": true}
JSON
# installed by rename, only where changed (a process with them loaded keeps its mapping)
source "$(dirname "$0")/install_by_rename.sh"
for f in "$BUILD"/bin/*.so*; do
  if [[ -e "$f" || -L "$f" ]]; then install_file "$f" "$PREFIX/lib"; fi
done
for t in "${todo[@]}"; do
  if [[ -x "$BUILD/bin/$t" ]]; then install_file "$BUILD/bin/$t" "$PREFIX/bin"; fi
  touch "$PREFIX/.built-$t-$BUILD_ID"
done
echo "llama.cpp $VERSION: ${todo[*]} built into $PREFIX"
