// Registry<Base>: compressors by name, one mechanism for every kind (GradReducer: DP and embedding
// reducers, grad_reducer.h; ActCodec: pipeline message codecs, act_codec.h). A factory builds one from its YAML options section; the
// built-ins are added by explicit register_builtin_*() calls (no static self-registration, so the
// set of compressors is visible where the registry is filled).
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace optcc {

template <class Base>
class Registry {
 public:
  /// `kind` names what it holds in errors ("compressor", "activation codec").
  explicit Registry(std::string kind = "compressor") : kind_(std::move(kind)) {}

  using Factory = std::function<std::unique_ptr<Base>(const YAML::Node& options)>;

  /// Throws std::invalid_argument when `name` is already registered.
  void add(const std::string& name, const std::string& help, Factory factory) {
    if (entries_.count(name)) throw std::invalid_argument("registry: '" + name + "' registered twice");
    entries_[name] = Entry{help, std::move(factory)};
  }

  /// Builds `name` from `options` (a map or null). An unknown name throws std::invalid_argument
  /// listing every known name with its help line; the factory validates the option keys.
  std::unique_ptr<Base> create(const std::string& name, const YAML::Node& options = YAML::Node()) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::string msg = "unknown " + kind_ + " '" + name + "'; known:";
      for (const auto& [n, e] : entries_) msg += "\n  " + n + ": " + e.help;
      throw std::invalid_argument(msg);
    }
    return it->second.factory(options);
  }

  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const {  // sorted
    std::vector<std::string> out;
    for (const auto& kv : entries_) out.push_back(kv.first);
    return out;
  }
  const std::string& help(const std::string& name) const { return entries_.at(name).help; }

 private:
  struct Entry {
    std::string help;
    Factory factory;
  };
  std::string kind_;
  std::map<std::string, Entry> entries_;
};

/// For factories: `options` must be null or a map whose keys are all in `known`; otherwise throws
/// std::invalid_argument naming the compressor, the offending key and the known keys.
inline void check_option_keys(const YAML::Node& options, const std::string& compressor,
                              const std::vector<std::string>& known) {
  if (!options || options.IsNull()) return;
  std::string known_list;
  for (const auto& k : known) known_list += (known_list.empty() ? "" : ", ") + k;
  if (!options.IsMap()) {
    throw std::invalid_argument(compressor + ": options must be a map (known keys: " + known_list + ")");
  }
  for (const auto& kv : options) {
    const auto key = kv.first.as<std::string>();
    bool ok = false;
    for (const auto& k : known) ok = ok || k == key;
    if (!ok) {
      throw std::invalid_argument(compressor + ": unknown option '" + key + "' (known: " + known_list + ")");
    }
  }
}

}  // namespace optcc
