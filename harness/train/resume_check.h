// What a resume may change. A checkpoint stores the effective config of the run that wrote it
// (meta/config); resuming it under another config is a different experiment unless only keys that
// do not touch the math of training changed. The trainer compares the two before it loads anything.
//
// May change on resume (listed in resume_mutable_keys(), nothing else):
//   train.train_steps        to run longer (or shorter) from the same state, as long as the decay
//                            length stays: with train.decay_steps 0 the cosine decay follows
//                            train_steps, so a changed train_steps is refused as a schedule change
//                            (the learning rate would jump) naming the explicit decay_steps that keeps it
//   train.decay_steps        only to a value giving the same decay length (e.g. an explicit
//                            train_steps - warmup_steps for 0)
//   train.eval_interval, train.eval_iters, train.threads
//   train.skip_nonfinite     what an fp32/bf16 run does on inf/NaN gradients (its stop's fix is to
//                            resume with it on); a run without such a fault computes the same
//   log.*, checkpoint.*      where and what is recorded
//   parallel.timeout_seconds, parallel.ranks_per_node (labels), parallel.interface, parallel.device,
//   parallel.backend
//                            (a GPU checkpoint resumes on CPU ranks and back; checkpoint.h)
//   network.* except network.skip   link emulation changes time, not values
//   data.dir                 the sample-index cache
// Everything else (the learning-rate schedule, optimizer, model, data, seed, precision,
// compression, network.skip, ...) is refused, naming each key with its checkpoint value and its new
// value, unless the caller allows changes (`optcc train --allow-config-change`); then each change is
// logged and kept in the results file's `resume_config_changes` attribute.
#pragma once

#include <string>
#include <vector>

namespace optcc {

/// One key whose value differs: dotted name, the checkpoint's value and this run's (YAML text).
struct ConfigChange {
  std::string key;
  std::string saved;
  std::string now;
};

/// The keys (dotted, or "section.*" for a whole section) a resume may change (see above).
const std::vector<std::string>& resume_mutable_keys();

/// Keys of the two effective configs (to_yaml texts) whose values differ and which a resume may not
/// change, in document order. A key the saved config lacks (written by an optcc without it) takes
/// its value from `defaults_yaml` (to_yaml of a default Config); otherwise "(unset)".
std::vector<ConfigChange> resume_config_changes(const std::string& saved_yaml, const std::string& now_yaml,
                                                const std::string& defaults_yaml);

/// "key: saved -> now" lines, one per change.
std::string describe_changes(const std::vector<ConfigChange>& changes);

}  // namespace optcc
