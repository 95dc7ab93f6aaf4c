// Exceptions thrown by astrai-jit. Everything derives from astrai::Error.
#pragma once

#include <stdexcept>
#include <string>

#include "astrai/export.hpp"

namespace astrai {

// Root of every exception the library throws.
class ASTRAI_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An argument of a public call is out of its allowed set; the message names the argument,
// its value and what is allowed. Thrown before anything is launched.
class ASTRAI_API InvalidArgument : public Error {
 public:
  using Error::Error;
};

// NVRTC rejected a program. Carries the variant, the options and the compiler log.
class ASTRAI_API CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string variant, std::string options,
               std::string log)
      : Error(message), variant_(std::move(variant)), options_(std::move(options)),
        log_(std::move(log)) {}
  const std::string& variant() const noexcept { return variant_; }
  const std::string& options() const noexcept { return options_; }
  const std::string& log() const noexcept { return log_; }

 private:
  std::string variant_;
  std::string options_;
  std::string log_;
};

// A CUDA driver call failed, or no driver / GPU is available for a call that needs one.
class ASTRAI_API CudaError : public Error {
 public:
  CudaError(const std::string& message, int result) : Error(message), result_(result) {}
  int result() const noexcept { return result_; }  // the CUresult value (0 if not from a call)

 private:
  int result_;
};

// A bad ASTRAI_JIT_* environment value, or a cache that cannot be used as configured.
class ASTRAI_API ConfigError : public Error {
 public:
  using Error::Error;
};

// ASTRAI_JIT_STRICT is set and the variant a call needs is not in the cache.
class ASTRAI_API CacheMissError : public Error {
 public:
  using Error::Error;
};

}  // namespace astrai
