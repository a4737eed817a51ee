// Error messages with numbers in them, built without iostreams.
//
// TORCH_CHECK(cond, "a ", n, " b") formats through std::ostringstream, instantiated in this
// library; on a lent H200 machine's host (torch 2.11, its own libstdc++) that formatting
// crashed the process (SIGSEGV in basic_ostream::_M_insert<long>) instead of raising, so a
// bad shape killed Python. TORCH_CHECK(cond, text(...)) hands torch one std::string, which
// c10::str passes through untouched, and the numbers go through std::to_string.
#pragma once

#include <string>
#include <type_traits>

namespace draftsman_msg {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
template <typename T>
  requires std::is_integral_v<T>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}

// text("rows of ", 12, " bytes") == "rows of 12 bytes"
template <typename... Args>
std::string text(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

}  // namespace draftsman_msg
