# install_file SRC DEST_DIR: put SRC (a file or a symlink) into DEST_DIR under its own name by
# rename, and only where it changed. A process that has the old file mapped (a benchmark
# that loaded llama.cpp's libraries and then builds its peers' examples on first use) keeps
# its mapping intact: `cp` rewrote the libraries in place and that process died in the
# dynamic loader (SIGSEGV). Sourced by build_llama_cpp.sh.
install_file() {
  local dest
  dest="$2/$(basename "$1")"
  if [[ -L "$1" ]]; then
    [[ -L "$dest" && "$(readlink "$1")" == "$(readlink "$dest")" ]] && return 0
  elif [[ -f "$dest" && ! -L "$dest" ]] && cmp -s "$1" "$dest"; then
    return 0
  fi
  cp -P "$1" "$dest.tmp.$$" && mv -f "$dest.tmp.$$" "$dest"
}
