#include "tests/support/paths.h"

namespace optcc::testing {

const char* source_dir() { return OPTCC_TEST_SOURCE_DIR; }
const char* binary_dir() { return OPTCC_TEST_BINARY_DIR; }

}  // namespace optcc::testing
