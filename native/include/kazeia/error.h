#pragma once

#include <stdexcept>
#include <string>

namespace kazeia {

// A model file that cannot be used: missing, corrupt, truncated or of the wrong kind.
class ModelError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// A caller's input that the engine rejects (shape, range). Maps to Python's ValueError.
class InputError : public std::invalid_argument {
  public:
    using std::invalid_argument::invalid_argument;
};

}  // namespace kazeia
