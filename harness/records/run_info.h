// Facts about this run recorded with every result: revision, versions, host, time.
#pragma once

#include <map>
#include <string>

namespace optcc {

/// Root attributes for the results file: git_revision (the build's, cmake/git_rev.cmake:
/// "<12 hex>[-dirty-<8 hex hash of the uncommitted source changes>]"), torch_version, compiler, hdf5 (filled by
/// the sink), host, start_time (UTC, ISO 8601), command line.
std::map<std::string, std::string> run_attributes(const std::string& command_line);
std::string hostname();
std::string utc_timestamp();  // "2026-11-30T01:23:45Z"

}  // namespace optcc
