// Command-line integers read as the config reads them (compression/options.h): decimal only.
// CLI11 converts with base 0, so on its own `--nproc 010` is 8 and `--steps 0x10` is 16; this
// transform refuses anything but [sign] digits and strips leading zeros first, so `010` is 10.
// Header-only and free of LibTorch and yaml-cpp: both `optcc` and `optcc-data` use it.
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <string>

namespace optcc {

/// A CLI11 transform for integer options: `opt->transform(decimal_integer())`.
inline CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
        bool digits = s.size() > sign;
        for (size_t i = sign; i < s.size(); ++i) digits = digits && std::isdigit(static_cast<unsigned char>(s[i]));
        if (!digits) return "'" + s + "' is not a decimal integer (hex, octal and fractions are refused)";
        const size_t first = s.find_first_not_of('0', sign);
        s = s.substr(0, sign) + (first == std::string::npos ? "0" : s.substr(first));
        return "";
      },
      "DECIMAL");
}

}  // namespace optcc
