#include "harness/train/resume_check.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <map>

namespace optcc {
namespace {

bool mutable_on_resume(const std::string& key) {
  for (const auto& k : resume_mutable_keys()) {
    if (k == key) return true;
    if (k.size() > 2 && k.compare(k.size() - 2, 2, ".*") == 0 && key.rfind(k.substr(0, k.size() - 1), 0) == 0) {
      return key != "network.skip";
    }
  }
  return false;
}

// section.key -> the value's YAML text (flow style: one line), in document order.
std::vector<std::pair<std::string, std::string>> flatten(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  const YAML::Node root = YAML::Load(yaml);
  if (!root.IsMap()) return out;
  for (const auto& section : root) {
    const std::string sec = section.first.as<std::string>();
    if (!section.second.IsMap()) {
      out.emplace_back(sec, YAML::Dump(section.second));
      continue;
    }
    for (const auto& kv : section.second) {
      YAML::Emitter e;
      e.SetMapFormat(YAML::Flow);
      e.SetSeqFormat(YAML::Flow);
      e << kv.second;
      out.emplace_back(sec + "." + kv.first.as<std::string>(), e.c_str());
    }
  }
  return out;
}

int64_t integer_of(const std::map<std::string, std::string>& keys, const std::string& key) {
  const auto it = keys.find(key);
  if (it == keys.end()) return 0;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    return 0;
  }
}

// The cosine decay length the schedule uses (harness/train/optimizer.h LrSchedule::from): decay_steps,
// or train_steps - warmup_steps when it is 0.
int64_t effective_decay(const std::map<std::string, std::string>& keys) {
  const int64_t decay = integer_of(keys, "train.decay_steps");
  return decay > 0 ? decay : std::max<int64_t>(1, integer_of(keys, "train.train_steps") - integer_of(keys, "train.warmup_steps"));
}

}  // namespace

const std::vector<std::string>& resume_mutable_keys() {
  static const std::vector<std::string> keys = {
      "train.train_steps",        "train.eval_interval",        "train.eval_iters",      "train.threads",
      "train.skip_nonfinite",
      "log.*",                    "checkpoint.*",               "parallel.timeout_seconds", "parallel.ranks_per_node", "parallel.interface",
      "parallel.device",          "parallel.backend",           "network.*",             "data.dir"};
  return keys;
}

std::vector<ConfigChange> resume_config_changes(const std::string& saved_yaml, const std::string& now_yaml,
                                                const std::string& defaults_yaml) {
  const auto saved = flatten(saved_yaml), now = flatten(now_yaml), defaults = flatten(defaults_yaml);
  const std::map<std::string, std::string> saved_by_key(saved.begin(), saved.end());
  const std::map<std::string, std::string> default_by_key(defaults.begin(), defaults.end());
  const std::map<std::string, std::string> now_by_key(now.begin(), now.end());
  std::vector<ConfigChange> changes;
  for (const auto& [key, value] : now) {
    if (mutable_on_resume(key)) continue;
    // The decay length is what counts: an explicit decay_steps equal to what 0 gives is the same
    // schedule; 0 on both sides with another train_steps is not (the cosine tail moves: the learning
    // rate would jump at the resume), and the change names the value that keeps the schedule.
    if (key == "train.decay_steps") {
      const int64_t was = effective_decay(saved_by_key), will = effective_decay(now_by_key);
      if (was == will) continue;
      const auto spelled = [](const std::string& v, int64_t steps) {
        return v == "0" ? fmt::format("0 (decays over {} steps: train_steps - warmup_steps)", steps) : v;
      };
      const auto it = saved_by_key.find(key);
      changes.push_back({key, spelled(it != saved_by_key.end() ? it->second : "0", was),
                         spelled(value, will) + fmt::format("; train.decay_steps={} keeps the checkpoint's schedule", was)});
      continue;
    }
    std::string before = "(unset)";
    if (const auto it = saved_by_key.find(key); it != saved_by_key.end()) {
      before = it->second;
    } else if (const auto d = default_by_key.find(key); d != default_by_key.end()) {
      before = d->second;  // written by an optcc without this key: it ran with the default
    }
    if (before != value) changes.push_back({key, before, value});
  }
  // A saved key this build does not know (now_yaml lists every key it has) changes nothing here.
  return changes;
}

std::string describe_changes(const std::vector<ConfigChange>& changes) {
  std::string out;
  for (const auto& c : changes) out += fmt::format("  {}: {} -> {}\n", c.key, c.saved, c.now);
  return out;
}

}  // namespace optcc
