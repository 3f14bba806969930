// The engine's KAZEIA_* switches: variables that benches and tests set to force a path, a layout
// or a behaviour (docs/settings.md lists them).
#pragma once

#include <cstdlib>
#include <cstring>

namespace kazeia {

// Whether the environment variable `name` is set to exactly `value`.
inline bool env_is(const char *name, const char *value) {
    const char *set = std::getenv(name);
    return set && std::strcmp(set, value) == 0;
}

}  // namespace kazeia
