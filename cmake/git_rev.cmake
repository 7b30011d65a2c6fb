# Writes OUT (a header defining OPTCC_GIT_REV) from git at BUILD time, so every build records the
# revision it was built from. With uncommitted changes to what is compiled (the source folders and
# the CMake files below; documentation, results and experiment files do not count), the revision
# gets "-dirty-<8 hex>": a SHA-1 of those changes (`git diff HEAD` of the folders, plus the names
# and contents of their untracked files). The diff itself is not kept, but two builds with the same
# suffix ran the same code. The file is rewritten only when the text changes, so an unchanged
# revision recompiles nothing.
set(source_paths harness models compression kernels datasets tests CMakeLists.txt cmake)
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
if(failed OR NOT rev)
  set(rev "unknown")
else()
  execute_process(COMMAND git diff HEAD -- ${source_paths} WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changes ERROR_QUIET)
  execute_process(COMMAND git ls-files --others --exclude-standard -- ${source_paths} WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE untracked OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(untracked)
    string(REPLACE "\n" ";" untracked_list "${untracked}")
    foreach(f IN LISTS untracked_list)
      file(SHA1 ${SRC}/${f} h)
      string(APPEND changes "untracked ${f} ${h}\n")
    endforeach()
  endif()
  if(changes)
    string(SHA1 h "${changes}")
    string(SUBSTRING "${h}" 0 8 h)
    set(rev "${rev}-dirty-${h}")
  endif()
endif()
set(text "#pragma once\n#define OPTCC_GIT_REV \"${rev}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
