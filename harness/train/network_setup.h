// From the config's `network:` section to a running link emulator (link_emulator.h) on one rank,
// and the launcher's shared NIC segment (nic_table.h). The trainer calls setup_network() once per
// run; the local launcher (optcc train --nproc N) calls make_launcher_nic_segment().
#pragma once

#include <memory>
#include <string>

#include "harness/config/config.h"
#include "harness/parallel/distributed.h"
#include "harness/parallel/link_emulator.h"

namespace optcc {

/// network.match_regime: from:<results file>: sets cfg.network's scale and both latencies to those the
/// earlier run recorded (its derived regime; same network.profile) and match_regime to "", measuring
/// nothing; returns the line to record as this run's network_regime ("<its line> (reused from FILE:
/// ...)"). Throws ConfigError naming the key when the file cannot be read, records no derived regime,
/// or derived it for another profile. Every rank calls it alike.
std::string reuse_recorded_regime(Config& cfg);

/// The declared links in SI units (GB/s -> bytes/s, µs -> s) and the skip mask.
LinkParams link_params(const NetworkConfig& n);

/// One line for the log and the results: "emulate=true profile=... intra_node_gbps=300 ...".
std::string network_summary(const NetworkConfig& n);

/// Attaches link emulation / skipping to every communicator of `d` (world, tp, dp, pp,
/// model-parallel, embedding, fused embedding) when cfg.network.emulate or cfg.network.skip is
/// set, and detaches it otherwise -- then nothing is constructed (no LinkEmulator, no NIC table).
/// All ranks call it (with emulation it is a world collective: the NIC table's rendezvous).
/// NIC table: `nics` when given (tests), else the segment named by $OPTCC_NIC_SHM (local
/// launcher), else for a world of one a LocalNicTable, else rank 0 creates a segment, the others
/// open it and rank 0 unlinks it once all have (single-host srun / torchrun).
/// Throws ConfigError when emulation is asked for while the ranks run on more than one host
/// (link_emulator.h: emulation only adds delay to real links, and the shared NICs live in one
/// machine's memory), std::runtime_error when the NIC segment cannot be opened.
void setup_network(Distributed& d, const Config& cfg, std::shared_ptr<NicTable> nics = nullptr);

/// The start-up log lines (rank 0): "network emulation on: ..." with the effective links and
/// nodes; a warning for network.skip (results not trainable); a note when links are declared but
/// emulate is false (recorded, not enforced).
void log_network(const NetworkConfig& n, const RankLayout& layout);

/// For the local launcher of `nproc` ranks: with cfg.network.emulate, creates the nodes' shared
/// NIC segment and exports its name in $OPTCC_NIC_SHM for the ranks it starts; the segment is
/// unlinked when the returned object dies (at the launcher's exit). Null when emulation is off.
std::unique_ptr<SharedNicSegment> make_launcher_nic_segment(const Config& cfg, int nproc);

}  // namespace optcc
