// A run's set-up steps before any collective (internal to harness/train; the Trainer calls them in
// Trainer::set_up and build_records): its datasets, the checkpoint it resumes from, its results
// file, the log line of its stage split.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "harness/config/config.h"
#include "harness/records/metrics.h"
#include "harness/train/trainer.h"

namespace optcc {

/// The run's token datasets: data.prefix's indexed dataset, checked against the config's vocabulary
/// (check_dataset_vocab), split by data.split; the sample indices are built or read from
/// <data.dir>/cache. Every rank calls it (each builds the same indices from train.seed). Throws
/// std::runtime_error naming `optcc data fetch/prepare` when the .bin/.idx files are missing, and
/// ConfigError when their token ids do not fit the vocabulary, or when data.split leaves no
/// validation document while train.eval_interval > 0 (an empty split with eval_interval 0 is a run
/// without evaluation: RunData::valid is null, and the trainer says so at start).
RunData open_data(const Config& c);

/// The checkpoint this run resumes from (nullopt: step 0), by TrainOptions' rules (trainer.h);
/// before any work. Throws std::runtime_error when --resume names no checkpoint, or when
/// checkpoint.dir holds one and neither --resume nor --resume auto was given.
std::optional<std::string> resume_point(const Config& c, const TrainOptions& o);

/// The results file: <log.dir>/<run>[.resumed-<step>].h5, or the first free
/// <that>.attempt-<n>.h5 (n = 2, 3, ...) when it exists, so an earlier attempt's results are never
/// overwritten (the sink creates exclusively). With log.timeline_steps, also the /timeline and
/// /breakdown tables. Global rank 0 only.
std::unique_ptr<Hdf5MetricsSink> create_results(const Config& c, int64_t first_step,
                                                const std::map<std::string, std::string>& attrs, bool quiet);

/// Each stage's layers as half-open ranges, "[0, 2) [2, 4)", for the start-up log.
std::string stage_layers_text(const Config& c);

}  // namespace optcc
