// compression_label (config.h): what a run compresses, in one short label.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "harness/config/config.h"

namespace optcc {
namespace {

// `name` or `name(key=value,...)` with the options as given, keys sorted (flow YAML for a
// non-scalar value).
std::string spec_label(const CompressorSpec& s) {
  if (!s.options || s.options.size() == 0) return s.name;
  std::map<std::string, std::string> parts;
  for (const auto& kv : s.options) {
    std::string value;
    if (kv.second.IsScalar()) {
      value = kv.second.Scalar();
    } else {
      YAML::Emitter e;
      e << YAML::Flow << kv.second;
      value = e.c_str();
    }
    parts[kv.first.as<std::string>()] = value;
  }
  std::vector<std::string> words;
  for (const auto& [key, value] : parts) words.push_back(key + "=" + value);
  return fmt::format("{}({})", s.name, fmt::join(words, ","));
}

// The settings that act, in the order data flows through a step, as `key=value` words.
std::vector<std::string> acting_settings(const CompressionConfig& c) {
  std::vector<std::string> out;
  if (c.tp.name != "none") out.push_back("tp=" + spec_label(c.tp));
  if (c.pipeline_forward.name != "none") out.push_back("pipeline_forward=" + spec_label(c.pipeline_forward));
  if (c.pipeline_backward.name != "none") {
    out.push_back("pipeline_backward=" + spec_label(c.pipeline_backward));
    if (c.backward_phases != BackwardPhases::kAll) out.push_back("backward_phases=" + to_string(c.backward_phases));
    if (c.lep != LepMode::kLazy) out.push_back("lep=" + to_string(c.lep));
    if (c.lep == LepMode::kLazyDecay) out.push_back(fmt::format("lep_decay={}", c.lep_decay));
  }
  if (c.dp.name != "none") {
    out.push_back("dp=" + spec_label(c.dp));
    if (c.dp_stages != DpStages::all()) out.push_back("dp_stages=" + c.dp_stages.text());
  }
  if (c.embedding.name != "none") out.push_back("embedding=" + spec_label(c.embedding));
  if (c.fused_embedding) out.push_back("fused_embedding");
  if (c.diloco_on()) {
    const DilocoConfig& g = c.diloco;
    out.push_back(fmt::format("dp_strategy=diloco(fragments={},inner_steps={},mix={},nesterov={},outer={},outer_lr={},"
                              "outer_momentum={},sync_delay={})",
                              g.fragments, g.inner_steps, g.mix, g.nesterov, spec_label(g.outer), g.outer_lr,
                              g.outer_momentum, g.sync_delay));
  }
  return out;
}

}  // namespace

bool compresses_nothing(const CompressionConfig& c) {
  return c.dp.name == "none" && c.embedding.name == "none" && !c.fused_embedding && !c.diloco_on() &&
         c.pipeline_forward.name == "none" && c.pipeline_backward.name == "none" && c.tp.name == "none";
}

std::string compression_label(const CompressionConfig& c) {
  if (compresses_nothing(c)) return "baseline";
  const auto mine = acting_settings(c);
  for (const auto& name : compression_scheme_names()) {
    CompressionConfig scheme;
    apply_compression_scheme(scheme, name);
    if (acting_settings(scheme) == mine) return name;
  }
  if (c.scheme.empty() || c.scheme == "baseline") return fmt::format("{}", fmt::join(mine, " "));
  // A named scheme with settings changed: the scheme, then what differs from it, key by key (a
  // setting of the scheme's that this config drops is written with its default value).
  CompressionConfig named;
  apply_compression_scheme(named, c.scheme);
  const auto key_of = [](const std::string& word) { return word.substr(0, word.find('=')); };
  std::map<std::string, std::string> theirs;
  for (const auto& w : acting_settings(named)) theirs[key_of(w)] = w;
  std::vector<std::string> differ;
  for (const auto& w : mine) {
    const auto it = theirs.find(key_of(w));
    if (it == theirs.end() || it->second != w) differ.push_back(w);
    if (it != theirs.end()) theirs.erase(it);
  }
  CompressionConfig defaults;
  for (const auto& [key, word] : theirs) {
    if (key == "fused_embedding") differ.push_back("fused_embedding=false");
    else if (key == "backward_phases") differ.push_back("backward_phases=" + to_string(defaults.backward_phases));
    else if (key == "lep") differ.push_back("lep=" + to_string(defaults.lep));
    else if (key == "dp_stages") differ.push_back("dp_stages=" + defaults.dp_stages.text());
    else differ.push_back(key + "=none");
  }
  // In acting_settings' order (the order data flows through a step).
  static const std::vector<std::string> order = {"tp",        "pipeline_forward", "pipeline_backward",
                                                 "backward_phases", "lep",       "lep_decay",
                                                 "dp",        "dp_stages",        "embedding",
                                                 "fused_embedding", "dp_strategy"};
  const auto rank = [&](const std::string& w) { return std::find(order.begin(), order.end(), key_of(w)) - order.begin(); };
  std::stable_sort(differ.begin(), differ.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return fmt::format("{} with {}", c.scheme, fmt::join(differ, " "));
}

}  // namespace optcc
