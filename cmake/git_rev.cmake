# Writes OUT (a header defining OPTCC_GIT_REV) from `git describe` of SRC at BUILD time, so every
# build records the revision it was built from ("-dirty" with uncommitted changes). The file is
# rewritten only when the text changes, so an unchanged revision recompiles nothing.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
if(failed OR NOT rev)
  set(rev "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    set(rev "${rev}-dirty")
  endif()
endif()
set(text "#pragma once\n#define OPTCC_GIT_REV \"${rev}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
