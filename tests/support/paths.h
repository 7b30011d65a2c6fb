// The checkout and the build folder of the build these tests belong to, as absolute paths.
// tests/support/paths.cpp is the one source that holds them (compiled with OPTCC_TEST_SOURCE_DIR and
// OPTCC_TEST_BINARY_DIR, tests/CMakeLists.txt): every other test source then compiles to the same
// command in any clone, so the compiler cache serves a clone in another folder (docs/builds.md,
// "CI and build times").
#pragma once

namespace optcc::testing {

/// The source tree (CMAKE_SOURCE_DIR), e.g. for experiments/*.yaml and scripts/.
const char* source_dir();
/// The build folder (CMAKE_BINARY_DIR): build/optcc, build/optcc-data.
const char* binary_dir();

}  // namespace optcc::testing
