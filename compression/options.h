// One strict reader for every scalar optcc takes from YAML: the config's sections (harness/config/config_io.cpp)
// and every compressor's options (the factories in this folder) parse integers, numbers and booleans
// through the functions below, so `010`, `0x10` or `.nan` mean the same thing (or fail the same way)
// wherever they are written.
//
// The rules (YAML 1.2 core schema, made strict):
//   integer  optional sign and decimal digits: `12`, `-3`, `+4`. Leading zeros are decimal, as YAML
//            1.2 reads them: `010` = 10 and `08` = 8 (YAML 1.1 and yaml-cpp read `010` as octal 8).
//            Refused: hex `0x10`, octal `0o10`, `1e3`, `1.0`, `1_000`, values outside int64.
//   number   a decimal or scientific float (`3e-4`, `.5`, `1.`, `-2.5E+3`) or an integer. Refused:
//            NaN and infinities in every spelling (`.nan`, `.inf`, `-.Inf`, `nan`, `inf`), hex floats,
//            and values that overflow a double (`1e999`): a number in a config must be finite.
//   boolean  `true` / `false` (also `True`, `TRUE`, `False`, `FALSE`); `yes`, `on`, `1` are refused.
// Each reader returns false and sets `why` (a phrase that completes "... is not an integer: ") when
// the text breaks a rule; it never throws. Quoted scalars are read by the same rules.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace optcc {

/// Parses decimal integer text (rules above). On failure returns false and sets `why`.
bool parse_integer_text(const std::string& text, int64_t& out, std::string& why);
/// Parses finite number text (rules above). On failure returns false and sets `why`.
bool parse_number_text(const std::string& text, double& out, std::string& why);
/// Parses `true`/`false` text (rules above). On failure returns false and sets `why`.
bool parse_boolean_text(const std::string& text, bool& out, std::string& why);

/// The same rules on a YAML node, which must be a scalar (a map or list is refused with `why`).
bool read_scalar(const YAML::Node& n, int64_t& out, std::string& why);
bool read_scalar(const YAML::Node& n, uint64_t& out, std::string& why);  // integer >= 0
bool read_scalar(const YAML::Node& n, double& out, std::string& why);
bool read_scalar(const YAML::Node& n, bool& out, std::string& why);
bool read_scalar(const YAML::Node& n, std::string& out, std::string& why);  // any scalar; null = ""

/// What a value of type T must be, for messages: "an integer", "a finite number", ...
template <class T> const char* scalar_type_name();
template <> inline const char* scalar_type_name<int64_t>() { return "an integer"; }
template <> inline const char* scalar_type_name<uint64_t>() { return "a non-negative integer"; }
template <> inline const char* scalar_type_name<double>() { return "a number"; }
template <> inline const char* scalar_type_name<bool>() { return "a boolean (true/false)"; }
template <> inline const char* scalar_type_name<std::string>() { return "a string"; }

/// For compressor factories: `options[key]` read by the rules above, or `fallback` when `options`
/// is null or has no `key`. Throws std::invalid_argument naming the compressor `who`, the key, the
/// value, the rule broken and the fix, e.g.
///   "powersgd: option 'rank' has a bad value '0x10': not an integer (hexadecimal is not accepted;
///    integers are decimal). Fix: give an integer, e.g. rank: 4"
template <class T>
T option_value(const YAML::Node& options, const std::string& who, const std::string& key, T fallback) {
  if (!options || options.IsNull() || !options.IsMap() || !options[key]) return fallback;
  const YAML::Node n = options[key];
  T out{};
  std::string why;
  if (read_scalar(n, out, why)) return out;
  const std::string text = n.IsScalar() ? n.Scalar() : YAML::Dump(n);
  throw std::invalid_argument(who + ": option '" + key + "' has a bad value '" + text + "': not " + scalar_type_name<T>() +
                              (why.empty() ? "" : " (" + why + ")") + ". Fix: give " + scalar_type_name<T>() +
                              ", e.g. " + key + ": " + YAML::Dump(YAML::Node(fallback)));
}

}  // namespace optcc
