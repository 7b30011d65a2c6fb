// YAML <-> Config: strict loading (unknown keys and wrong types are errors), overrides, output.
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compression/options.h"
#include "harness/config/config.h"
#include "models/presets.h"

namespace optcc {
namespace {

template <class T> const char* type_name() { return scalar_type_name<T>(); }
template <> const char* type_name<std::vector<std::string>>() { return "a list of strings"; }
template <> const char* type_name<std::vector<int64_t>>() { return "a list of integers"; }
template <> const char* type_name<DpStages>() { return "all, auto or a positive integer (the leading stages that compress)"; }
template <> const char* type_name<BackwardPhases>() {
  static const std::string text = fmt::format("one of {}", fmt::join(backward_phases_names(), ", "));
  return text.c_str();
}
template <> const char* type_name<LepMode>() {
  static const std::string text = fmt::format("one of {}", fmt::join(lep_mode_names(), ", "));
  return text.c_str();
}
template <> const char* type_name<CompressorSpec>() {
  return "a compressor name or a mapping {name: ..., <option>: ...}";
}

std::string format_value(const std::string& v) { return v; }
std::string format_value(int64_t v) { return std::to_string(v); }
std::string format_value(double v) { return fmt::format("{}", v); }
std::string format_value(bool v) { return v ? "true" : "false"; }
std::string format_value(BackwardPhases v) { return to_string(v); }
std::string format_value(const DpStages& v) { return v.text(); }
std::string format_value(LepMode v) { return to_string(v); }
std::string format_value(const CompressorSpec& c) {
  if (!c.options || c.options.size() == 0) return c.name;
  YAML::Emitter e;
  e << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << c.name;
  for (const auto& kv : c.options) e << YAML::Key << kv.first << YAML::Value << kv.second;
  e << YAML::EndMap;
  return e.c_str();
}
template <class T> std::string format_value(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + format_value(v[i]);
  return out + "]";
}

std::string node_text(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "(empty)";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// Parses `n` into `out` or returns false with `why` (the rule broken, or ""). Scalars go through
// compression/options.h, the one strict reader of every numeric value: decimal integers (`010` is
// 10, hex refused), finite numbers only (NaN and infinities refused), true/false booleans.
bool parse(const YAML::Node& n, std::string& out, std::string& why) { return read_scalar(n, out, why); }
bool parse(const YAML::Node& n, int64_t& out, std::string& why) { return read_scalar(n, out, why); }
bool parse(const YAML::Node& n, double& out, std::string& why) { return read_scalar(n, out, why); }
bool parse(const YAML::Node& n, bool& out, std::string& why) { return read_scalar(n, out, why); }
// The enum settings (compression/pipeline_policy.h): one of their names.
template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
bool parse(const YAML::Node& n, E& out, std::string& why) {
  std::string s;
  if (!read_scalar(n, s, why)) return false;
  return parse_name(s, out);
}
bool parse(const YAML::Node& n, DpStages& out, std::string& why) {
  std::string s;
  return read_scalar(n, s, why) && parse_dp_stages(s, out, why);
}
bool parse(const YAML::Node& n, CompressorSpec& out, std::string& why) {
  if (n.IsScalar()) {
    out.name = n.Scalar();
    out.options.reset(YAML::Node(YAML::NodeType::Map));
    return true;
  }
  if (!n.IsMap() || !n["name"] || !n["name"].IsScalar()) return false;
  out.name = n["name"].Scalar();
  out.options.reset(YAML::Node(YAML::NodeType::Map));
  for (const auto& kv : n) {
    if (kv.first.as<std::string>() != "name") out.options[kv.first.as<std::string>()] = YAML::Clone(kv.second);
  }
  return true;
}
template <class T> bool parse(const YAML::Node& n, std::vector<T>& out, std::string& why) {
  if (n.IsNull()) { out.clear(); return true; }
  if (!n.IsSequence()) return false;
  std::vector<T> tmp(n.size());
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar() || !parse(n[i], tmp[i], why)) {
      why = fmt::format("element {} = {}{}", i, node_text(n[i]), why.empty() ? "" : ": " + why);
      return false;
    }
  }
  out = std::move(tmp);
  return true;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1])});
      prev = cur;
    }
  }
  return row[b.size()];
}

// Names users bring from Megatron-LM, nanoGPT or HF configs, mapped to ours.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {
      {"learning_rate", "lr"},         {"min_learning_rate", "min_lr"}, {"train_iters", "train_steps"},
      {"max_steps", "train_steps"},    {"iters", "train_steps"},        {"batch_size", "global_batch_size"},
      {"micro_batch", "micro_batch_size"}, {"seq_length", "seq_len"},   {"block_size", "seq_len"},
      {"n_layer", "num_layers"},       {"layers", "num_layers"},        {"n_embd", "hidden_size"},
      {"hidden", "hidden_size"},       {"n_head", "num_heads"},         {"num_attention_heads", "num_heads"},
      {"warmup", "warmup_steps"},      {"lr_warmup_iters", "warmup_steps"}, {"grad_clip", "clip_grad"},
      {"dropout", "hidden_dropout"},   {"tensor_parallel", "tp"},       {"pipeline_parallel", "pp"},
      {"data_parallel", "dp"},         {"log_interval", "interval"},    {"save_interval", "interval"},
  };
  return a;
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
  const auto alias = aliases().find(key);
  if (alias != aliases().end() &&
      std::find(known.begin(), known.end(), alias->second) != known.end()) {
    return fmt::format(" (did you mean '{}'?)", alias->second);
  }
  std::string best;
  size_t best_d = 4;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) { best_d = d; best = k; }
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

template <class S> std::vector<std::string> keys_of(S& section) {
  std::vector<std::string> keys;
  section.visit([&](const char* k, auto&) { keys.emplace_back(k); });
  return keys;
}

std::vector<std::string> section_names(Config& c) {
  std::vector<std::string> names;
  for_each_section(c, [&](const char* name, auto&) { names.emplace_back(name); });
  return names;
}

// Sets `section.key` from node `n`; `where` says where the value came from (file or --set).
template <class S>
void set_field(S& section, const std::string& sec, const std::string& key, const YAML::Node& n,
               const std::string& where) {
  bool found = false;
  section.visit([&](const char* k, auto& field) {
    if (key != k) return;
    found = true;
    using T = std::decay_t<decltype(field)>;
    std::string why;
    if (!parse(n, field, why)) {
      throw ConfigError(fmt::format(
          "config error ({}): {}.{} = {} is not {}{}; the current value is {}. Fix: give {}, "
          "e.g. `{}: {}`.",
          where, sec, key, node_text(n), type_name<T>(), why.empty() ? "" : " (" + why + ")",
          format_value(T{field}), type_name<T>(), key, format_value(T{field})));
    }
  });
  if (!found) {
    auto known = keys_of(section);
    throw ConfigError(fmt::format(
        "config error ({}): unknown key '{}.{}'{}. Known keys in '{}': {}. Fix: remove or rename it.",
        where, sec, key, suggestion(key, known), sec, join(known)));
  }
}

void apply_preset(Config& cfg, const std::string& name, const std::string& where) {
  const ModelPreset* p = find_model_preset(name);
  if (!p) {
    throw ConfigError(fmt::format(
        "config error ({}): model.preset = '{}' is not a known preset. Known presets: {}. Fix: "
        "pick one of them, or set model.num_layers/hidden_size/num_heads/seq_len explicitly on "
        "top of the closest preset.",
        where, name, model_preset_names()));
  }
  cfg.model.preset = p->name;
  cfg.model.num_layers = p->num_layers;
  cfg.model.hidden_size = p->hidden_size;
  cfg.model.num_heads = p->num_heads;
  cfg.model.seq_len = p->seq_len;
}

// Dispatches "section", "key", node to the right struct.
void set_key(Config& cfg, const std::string& sec, const std::string& key, const YAML::Node& n,
             const std::string& where) {
  bool found = false;
  for_each_section(cfg, [&](const char* name, auto& section) {
    if (sec != name) return;
    found = true;
    if (sec == "model" && key == "preset") {
      std::string preset, why;
      if (!parse(n, preset, why)) set_field(section, sec, key, n, where);  // throws the type error
      apply_preset(cfg, preset, where);
      return;
    }
    if (sec == "compression" && key == "scheme") {
      std::string scheme, why;
      if (!parse(n, scheme, why)) set_field(section, sec, key, n, where);  // throws the type error
      try {
        apply_compression_scheme(cfg.compression, scheme);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("config error ({}): {}", where, e.what()));
      }
      return;
    }
    if (sec == "network" && key == "profile") {  // fills the link keys not set explicitly
      std::string profile, why;
      if (!parse(n, profile, why)) set_field(section, sec, key, n, where);  // throws the type error
      try {
        apply_network_profile(cfg.network, profile);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("config error ({}): {}", where, e.what()));
      }
      return;
    }
    set_field(section, sec, key, n, where);
    static const std::set<std::string> link_keys = {"intra_node_gbps", "inter_node_gbps", "intra_node_latency_us",
                                                    "inter_node_latency_us", "scale"};
    if (sec == "network" && link_keys.count(key)) {
      cfg.network.explicit_keys.push_back(key);  // a profile never overwrites it (any order); match_regime refuses it
    }
  });
  if (!found) {
    auto known = section_names(cfg);
    throw ConfigError(fmt::format(
        "config error ({}): unknown section '{}'{}. Known sections: {}. Fix: remove or rename it.",
        where, sec, suggestion(sec, known), join(known)));
  }
}

void apply_document(Config& cfg, const YAML::Node& root, const std::string& where) {
  if (root.IsNull()) return;
  if (!root.IsMap()) {
    throw ConfigError(fmt::format("config error ({}): the top level must be a mapping of "
                                  "sections (model:, train:, ...), found {}.",
                                  where, node_text(root)));
  }
  for (const auto& sec : root) {
    const std::string sec_name = sec.first.as<std::string>();
    const YAML::Node& body = sec.second;
    if (body.IsNull()) continue;
    if (!body.IsMap()) {
      throw ConfigError(fmt::format(
          "config error ({}): section '{}' must be a mapping of key: value, found {}.", where,
          sec_name, node_text(body)));
    }
    // The preset goes first so explicit sizes in the same section override it.
    // The preset (scheme) goes first so explicit keys in the same section override it.
    if (sec_name == "model" && body["preset"]) set_key(cfg, "model", "preset", body["preset"], where);
    if (sec_name == "compression" && body["scheme"]) {
      set_key(cfg, "compression", "scheme", body["scheme"], where);
    }
    for (const auto& kv : body) {
      const std::string key = kv.first.as<std::string>();
      if (sec_name == "model" && key == "preset") continue;
      if (sec_name == "compression" && key == "scheme") continue;
      set_key(cfg, sec_name, key, kv.second, where);
    }
  }
}

}  // namespace

namespace {

// A scheme resets the compression section, so --set compression.scheme goes first whatever
// its position on the command line (as `scheme:` does inside a file).
void apply_overrides(Config& cfg, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) {
    if (o.rfind("compression.scheme=", 0) == 0) apply_override(cfg, o);
  }
  for (const auto& o : overrides) {
    if (o.rfind("compression.scheme=", 0) != 0) apply_override(cfg, o);
  }
}

}  // namespace

namespace {

std::string repeated_key_in(const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string r = repeated_key_in(node[i], fmt::format("{}[{}]", path, i));
      if (!r.empty()) return r;
    }
    return "";
  }
  if (!node.IsMap()) return "";
  std::map<std::string, int> first_line;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) continue;
    const std::string key = kv.first.Scalar();
    const int line = kv.first.Mark().line + 1;
    const std::string here = path.empty() ? key : path + "." + key;
    if (const auto it = first_line.find(key); it != first_line.end()) {
      return fmt::format("{} (lines {} and {})", here, it->second, line);
    }
    first_line.emplace(key, line);
    const std::string r = repeated_key_in(kv.second, here);
    if (!r.empty()) return r;
  }
  return "";
}

void check_no_repeated_key(const YAML::Node& root, const std::string& where) {
  const std::string r = repeated_yaml_key(root);
  if (r.empty()) return;
  throw ConfigError(fmt::format("config error ({}): key {} is written twice; YAML keeps one of them silently. Fix: "
                                "keep one (merge the two sections when a section is repeated).",
                                where, r));
}

}  // namespace

std::string repeated_yaml_key(const YAML::Node& node) { return repeated_key_in(node, ""); }

void apply_override(Config& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw ConfigError(fmt::format(
        "config error (--set): '{}' is not of the form section.key=value. Fix: e.g. "
        "--set train.lr=3e-4",
        assignment));
  }
  const std::string sec = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string text = assignment.substr(eq + 1);
  YAML::Node n;
  try {
    n = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("config error (--set {}): value '{}' is not valid YAML: {}",
                                  assignment, text, e.what()));
  }
  check_no_repeated_key(n, "--set " + assignment);
  set_key(cfg, sec, key, n, "--set " + assignment);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config cfg;
  if (!path.empty()) {
    if (!std::filesystem::exists(path)) {
      throw ConfigError(fmt::format("config error: file '{}' does not exist. Fix: pass one of "
                                    "experiments/*.yaml to --config.",
                                    path));
    }
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("config error: {} is not valid YAML: {}", path, e.what()));
    }
    check_no_repeated_key(root, path);
    apply_document(cfg, root, path);
    cfg.source_path = path;
  }
  apply_overrides(cfg, overrides);
  return cfg;
}

Config load_config_text(const std::string& yaml, const std::string& origin, const std::vector<std::string>& overrides) {
  Config cfg;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("config error: {} is not valid YAML: {}", origin, e.what()));
  }
  check_no_repeated_key(root, origin);
  apply_document(cfg, root, origin);
  apply_overrides(cfg, overrides);
  return cfg;
}

std::string to_yaml_value(const CompressorSpec& spec) { return format_value(spec); }

std::string to_yaml(const Config& const_cfg) {
  Config cfg = const_cfg;  // visit() is non-const by design; copy is cheap
  YAML::Emitter out;
  out << YAML::BeginMap;
  for_each_section(cfg, [&](const char* name, auto& section) {
    out << YAML::Key << name << YAML::Value << YAML::BeginMap;
    section.visit([&](const char* key, auto& field) {
      using T = std::decay_t<decltype(field)>;
      out << YAML::Key << key << YAML::Value;
      if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                    std::is_same_v<T, std::vector<int64_t>>) {
        out << YAML::Flow << YAML::BeginSeq;
        for (const auto& x : field) out << x;
        out << YAML::EndSeq;
      } else if constexpr (std::is_same_v<T, CompressorSpec>) {
        if (!field.options || field.options.size() == 0) {
          out << field.name;
        } else {
          out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << field.name;
          for (const auto& kv : field.options) out << YAML::Key << kv.first << YAML::Value << kv.second;
          out << YAML::EndMap;
        }
      } else if constexpr (std::is_same_v<T, std::string>) {
        out << YAML::DoubleQuoted << field;
      } else if constexpr (std::is_enum_v<T>) {
        out << YAML::DoubleQuoted << to_string(field);
      } else if constexpr (std::is_same_v<T, DpStages>) {
        out << YAML::DoubleQuoted << field.text();
      } else if constexpr (std::is_same_v<T, double>) {
        std::string s = fmt::format("{}", field);
        if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
            s.find("nan") == std::string::npos) {
          s += ".0";  // keep it a float on reload
        }
        out << s;
      } else {
        out << field;
      }
    });
    out << YAML::EndMap;
  });
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

int64_t prepared_vocab_size(const std::string& prefix) {
  const std::string meta = prefix + ".json";
  std::ifstream in(meta);
  if (!in) return 0;
  try {
    return nlohmann::json::parse(in).at("vocab_size").get<int64_t>();
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("config error: cannot read vocab_size from {}: {}. Fix: re-run "
                                  "`optcc data prepare`.",
                                  meta, e.what()));
  }
}

void resolve_vocab(Config& cfg) {
  if (cfg.model.vocab_size != 0) return;  // a negative value is left for validate() to name
  if (!std::filesystem::exists(cfg.data.prefix + ".json")) {
    throw ConfigError(fmt::format(
        "config error: model.vocab_size = 0 means 'take it from the dataset', but {}.json does not "
        "exist. Fix: run `optcc data fetch` and `optcc data prepare --config {}` first, or set "
        "model.vocab_size explicitly.",
        cfg.data.prefix, cfg.source_path.empty() ? "<config>" : cfg.source_path));
  }
  cfg.model.vocab_size = prepared_vocab_size(cfg.data.prefix);
}

void check_tokenizer_vocab(const Config& cfg, int64_t dataset_vocab_size) {
  if (dataset_vocab_size <= 0 || dataset_vocab_size == cfg.model.vocab_size) return;
  const std::string& prefix = cfg.data.prefix;
  throw ConfigError(fmt::format(
      "config error: model.vocab_size = {} but the dataset {} was tokenized with a vocabulary of {} pieces ({}.json "
      "vocab_size, tokenizer {}.model): a model trained on it learns the wrong embedding rows, even though every id "
      "fits. Fix: point data.prefix at a dataset prepared with a tokenizer of {} pieces, or set model.vocab_size: 0 to "
      "take {} from the dataset (config: {}).",
      cfg.model.vocab_size, prefix, dataset_vocab_size, prefix, prefix, cfg.model.vocab_size, dataset_vocab_size,
      cfg.source_path.empty() ? "<config>" : cfg.source_path));
}

void check_dataset_vocab(const Config& cfg, int64_t min_token_id, int64_t max_token_id, int64_t dataset_vocab_size) {
  const std::string& prefix = cfg.data.prefix;
  const std::string config = cfg.source_path.empty() ? "<config>" : cfg.source_path;
  if (min_token_id < 0) {
    throw ConfigError(fmt::format("data error: {}.bin holds the negative token id {}; token ids index the embedding "
                                  "and must be >= 0. Fix: rebuild the dataset with `optcc data prepare --config {} "
                                  "--retrain`.", prefix, min_token_id, config));
  }
  if (dataset_vocab_size > 0 && max_token_id >= dataset_vocab_size) {
    throw ConfigError(fmt::format(
        "data error: {}.bin holds token id {} but {}.json says vocab_size {}: the .bin/.idx and the .json (and "
        "perhaps the .model) come from different `prepare` runs. Fix: rebuild them together with `optcc data "
        "prepare --config {} --retrain`.", prefix, max_token_id, prefix, dataset_vocab_size, config));
  }
  if (max_token_id >= cfg.model.vocab_size) {
    throw ConfigError(fmt::format(
        "config error: model.vocab_size = {} but the dataset {} holds token ids up to {} (prepared with vocab_size "
        "{}); ids must be < model.vocab_size. Fix: set model.vocab_size to 0 (take it from the dataset) or to at "
        "least {}; or prepare the data for this model with data.vocab_size <= {} (`optcc data prepare --config {}`).",
        cfg.model.vocab_size, prefix, max_token_id,
        dataset_vocab_size > 0 ? std::to_string(dataset_vocab_size) : std::string("unknown: no .json"),
        std::max(dataset_vocab_size, max_token_id + 1), cfg.model.vocab_size, config));
  }
  check_tokenizer_vocab(cfg, dataset_vocab_size);
}

}  // namespace optcc
