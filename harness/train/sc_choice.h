// SC `auto` (compression.dp_stages: auto, docs/design.md §6.5): which pipeline stages compress their DP
// gradients, decided by one timed calibration step before training (internal to harness/train).
#pragma once

#include <string>
#include <vector>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/schedule.h"
#include "harness/train/stage_functions.h"
#include "harness/train/trainer.h"

namespace optcc {

// SC `auto` (docs/design.md §6.5): one calibration step before training decides which stages compress.
struct ScChoice {
  std::vector<bool> compress;           // [stages]
  std::vector<double> end, raw, comp0;  // per stage: schedule end after a common barrier, raw DP
                                        // all-reduce time, stage 0's compressed time (s)
};

/// Runs one pipeline step (uncompressed links, the first m micro-batches of the training data,
/// not advancing the run's loader) and times, per stage, the end of its schedule after a common
/// barrier and its DP all-reduce raw and (stage 0) with compression.dp; stage k compresses iff its
/// raw all-reduce would end after stage 0's compressed one. Nothing of the run changes: the CPU
/// and attention generators are restored, gradients cleared, no optimizer step, the traffic meter
/// reset. act_shape: the stage boundary activation [b, s, h]. Collective over the world: every
/// rank calls it, before training (and not when a checkpoint holds the choice).
ScChoice calibrate_sc_auto(const Config& cfg, Distributed& d, GptModel& model, const PipelineSchedule& pipeline,
                           GptStageFunctions& fn, const std::vector<int64_t>& act_shape, int64_t m,
                           const RunData& data);

/// Which stages compress DP gradients, for the log and results: "c,c,raw", or "all raw" without
/// a DP compressor.
std::string sc_stages_text(const Config& cfg, const std::vector<bool>& sc_compress);

}  // namespace optcc
