// The policy Optimus-CC puts on compressed pipeline messages, as typed settings and the rules that
// act on them. compression.backward_phases, compression.lep and compression.lep_decay are parsed
// into a PipelinePolicy once, when the config is loaded (harness/config/config_io.cpp); the
// pipeline codec that applies it (compression/pipeline_codec.h), the traffic model and the
// simulator (harness/perfmodel/traffic_estimate.h) all read these values and these rules.
//   - Epilogue-only (docs/design.md §4): under BackwardPhases::kEpilogue only backward sends in the
//     epilogue (a flush call: harness/parallel/schedule.h backward_send_is_epilogue) are compressed.
//   - Lazy error propagation (LEP, docs/design.md §3.1): the error a compressed backward send leaves
//     is added to a later send. kLazy keeps one buffer per rank (the paper); kPerMicrobatch one per
//     micro-batch slot (classic error feedback, m buffers); kOff drops it (NON-LEP);
//     kLazyIteration keeps one buffer and drops it at the end of every iteration; kLazyDecay keeps
//     one and carries β·error (β = lep_decay in (0, 1]; 1 is kLazy bit for bit).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace optcc {

enum class BackwardPhases { kAll, kEpilogue };
enum class LepMode { kOff, kLazy, kPerMicrobatch, kLazyIteration, kLazyDecay };

/// The config's names, in enum order: "all", "epilogue"; "off", "lazy", "per_microbatch",
/// "lazy_iteration", "lazy_decay".
const std::vector<std::string>& backward_phases_names();
const std::vector<std::string>& lep_mode_names();
std::string to_string(BackwardPhases p);
std::string to_string(LepMode m);
/// False for a name that is not one of the above (`out` untouched).
bool parse_name(const std::string& s, BackwardPhases& out);
bool parse_name(const std::string& s, LepMode& out);
/// As parse_name, throwing std::invalid_argument naming the known names.
BackwardPhases parse_backward_phases(const std::string& s);
LepMode parse_lep_mode(const std::string& s);

struct PipelinePolicy {
  BackwardPhases phases = BackwardPhases::kAll;
  LepMode lep = LepMode::kLazy;
  double lep_decay = 1.0;  // β of kLazyDecay

  /// Whether a backward send is compressed (given a backward codec): always under kAll, only in
  /// the epilogue under kEpilogue. Both ends of a message decide alike (the schedule gives them
  /// the same flag).
  bool compresses_backward_send(bool epilogue) const { return phases == BackwardPhases::kAll || epilogue; }
  /// Whether compressed backward sends carry their error to a later send.
  bool keeps_error() const { return lep != LepMode::kOff; }
  /// The LEP buffers a rank holds at most during a step with `compressed_sends` compressed
  /// backward sends (one per micro-batch at most): none for kOff or when no send is compressed,
  /// one per compressed micro-batch for kPerMicrobatch, else one. Each is one backward slice in
  /// fp32, so a sending chunk's LEP memory is this times 4 · slice (a rank: the sum over its chunks).
  int64_t lep_buffers(int64_t compressed_sends) const {
    if (!keeps_error() || compressed_sends <= 0) return 0;
    return lep == LepMode::kPerMicrobatch ? compressed_sends : 1;
  }
};

}  // namespace optcc
