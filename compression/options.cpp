#include "compression/options.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace optcc {
namespace {

bool all_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Why a non-decimal integer spelling is refused, or "" when nothing specific applies.
std::string integer_hint(const std::string& t) {
  const size_t sign = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  const std::string body = lower(t.substr(sign));
  if (body.rfind("0x", 0) == 0) return "hexadecimal is not accepted; integers are decimal";
  if (body.rfind("0o", 0) == 0) return "octal is not accepted; integers are decimal";
  if (body.rfind("0b", 0) == 0) return "binary is not accepted; integers are decimal";
  if (body.find('_') != std::string::npos) return "digit separators '_' are not accepted";
  if (body.find_first_of(".e") != std::string::npos) return "a fraction or exponent is not an integer";
  return "";
}

// Decimal float grammar: [sign] (digits [. digits?] | . digits) [(e|E) [sign] digits].
bool is_decimal_float(const std::string& t) {
  size_t i = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  const size_t int_start = i;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  size_t digits = i - int_start;
  if (i < t.size() && t[i] == '.') {
    const size_t frac_start = ++i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
    digits += i - frac_start;
  }
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (!all_digits(t, i, t.size())) return false;
    i = t.size();
  }
  return i == t.size();
}

bool is_non_finite_spelling(const std::string& t) {
  std::string body = lower(t);
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.erase(0, 1);
  if (!body.empty() && body[0] == '.') body.erase(0, 1);
  return body == "nan" || body == "inf" || body == "infinity";
}

}  // namespace

bool parse_integer_text(const std::string& t, int64_t& out, std::string& why) {
  const size_t sign = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (!all_digits(t, sign, t.size())) {
    why = integer_hint(t);
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);  // base 10: leading zeros stay decimal
  if (errno == ERANGE) {
    why = "outside the 64-bit integer range";
    return false;
  }
  out = static_cast<int64_t>(v);
  return true;
}

bool parse_number_text(const std::string& t, double& out, std::string& why) {
  if (is_non_finite_spelling(t)) {
    why = "NaN and infinity are not accepted; numbers must be finite";
    return false;
  }
  if (!is_decimal_float(t)) {
    why = lower(t).find("0x") != std::string::npos ? "hexadecimal is not accepted" : "";
    return false;
  }
  errno = 0;
  const double v = std::strtod(t.c_str(), nullptr);
  if (errno == ERANGE && std::fabs(v) > 1.0) {
    why = "too large for a double; numbers must be finite";
    return false;
  }
  out = v;  // underflow to 0 or a denormal is a finite reading of the text
  return true;
}

bool parse_boolean_text(const std::string& t, bool& out, std::string& why) {
  if (t == "true" || t == "True" || t == "TRUE") {
    out = true;
    return true;
  }
  if (t == "false" || t == "False" || t == "FALSE") {
    out = false;
    return true;
  }
  why = "";
  return false;
}

namespace {
bool scalar_text(const YAML::Node& n, std::string& text, std::string& why) {
  if (!n.IsDefined() || !n.IsScalar()) {
    why = n.IsDefined() && (n.IsMap() || n.IsSequence()) ? "a mapping or list where one value belongs" : "";
    return false;
  }
  text = n.Scalar();
  return true;
}
}  // namespace

bool read_scalar(const YAML::Node& n, int64_t& out, std::string& why) {
  std::string t;
  return scalar_text(n, t, why) && parse_integer_text(t, out, why);
}

bool read_scalar(const YAML::Node& n, uint64_t& out, std::string& why) {
  int64_t v = 0;
  if (!read_scalar(n, v, why)) return false;
  if (v < 0) {
    why = "must not be negative";
    return false;
  }
  out = static_cast<uint64_t>(v);
  return true;
}

bool read_scalar(const YAML::Node& n, double& out, std::string& why) {
  std::string t;
  return scalar_text(n, t, why) && parse_number_text(t, out, why);
}

bool read_scalar(const YAML::Node& n, bool& out, std::string& why) {
  std::string t;
  return scalar_text(n, t, why) && parse_boolean_text(t, out, why);
}

bool read_scalar(const YAML::Node& n, std::string& out, std::string& why) {
  if (n.IsDefined() && n.IsNull()) {
    out.clear();
    return true;
  }
  return scalar_text(n, out, why);
}

}  // namespace optcc
