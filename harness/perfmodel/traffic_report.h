// The `optcc traffic` report: the analytic estimate (traffic_estimate.h) as a text table per GPU
// of each stage and for the cluster with docs/design.md §9's rows, or as one JSON document.
#pragma once

#include <string>

#include "harness/perfmodel/traffic_estimate.h"

namespace optcc {

/// Decimal units as docs/design.md §9 prints them: "518 MB", "12.08 GB", "17.7 TB" (4 significant digits).
std::string format_bytes(double bytes);

/// The `optcc traffic` output: a class x link table per GPU of each stage and for the cluster, then
/// docs/design.md §9 rows. `json`: one JSON document with the same numbers (bytes, not rounded).
std::string traffic_report(const Config& cfg, const TrafficEstimate& e, const PaperTrafficRows& rows,
                           const TrafficModelOptions& o);
std::string traffic_report_json(const Config& cfg, const TrafficEstimate& e, const PaperTrafficRows& rows,
                                const TrafficModelOptions& o);

}  // namespace optcc
