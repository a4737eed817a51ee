// A kernel path's off switch in the environment: VARIABLE=0 turns it off (to measure it against
// the path beneath on the same CPU). Read once per process by each caller's static.
#pragma once

#include <cstdlib>
#include <cstring>

namespace draftsman_env {

inline bool turned_off(const char* variable) {
  const char* v = std::getenv(variable);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace draftsman_env
